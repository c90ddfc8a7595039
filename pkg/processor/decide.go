package processor

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"google.golang.org/protobuf/types/known/structpb"
)

// decision is the outcome of choosing a route for a request.
type decision struct {
	immediate *extprocv3.ProcessingResponse // a local reply instead of a dispatch
	fallbacks string                        // remaining candidate clusters, comma-separated
	stage     *structpb.Struct
}

// maxStackCandidates bounds the candidates decided on stack buffers.
const maxStackCandidates = 8

// decide applies R-D1..R-D3, R-F2, R-F3 and R-M1..R-M3 for st.modelName and
// sets st.chosen, st.target and st.adm.
func (st *stream) decide() decision {
	gw := st.gw
	m, ok := gw.Model(st.modelName)
	if !ok {
		st.s.metrics.Decisions.WithLabelValues(gw.ID, "", routes.ActionRejected).Inc()
		return decision{immediate: immediate(404, typeInvalidRequest, codeModelUnknown,
			fmt.Sprintf("model %q is not served by gateway %q", st.modelName, gw.ID))}
	}
	st.model = m
	cands := m.Candidates(st.residency)
	if len(cands) == 0 {
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, routes.ActionRejected).Inc()
		return decision{immediate: immediate(404, typeInvalidRequest, codeModelUnknown,
			fmt.Sprintf("model %q has no route with residency %q", m.Name, strings.Join(st.residency, ",")))}
	}
	st.first = cands[0]
	pol := m.Policy
	if !pol.Active() {
		// R-M1: nothing consulted or recorded, still dispatched.
		st.chosen = cands[0]
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, routes.ActionRouted).Inc()
		return decision{fallbacks: clusters(cands, nil, 0)}
	}

	now := st.startNs
	var vbuf [maxStackCandidates]breaker.Verdict
	var obuf, sbuf [maxStackCandidates]int
	verdicts := vbuf[:0]
	for _, r := range cands {
		verdicts = append(verdicts, st.comp.targets[r].Peek(now))
	}
	sel := routes.Select(now, verdicts, pol.MaxEjectionPercent, pol.WhenAllOpen, obuf[:0], sbuf[:0])

	if pol.Mode == breaker.ModeShadow {
		// R-M2: dispatched as if off; health tracked; the stage says what
		// prod would have skipped. A route forced open by an operator is
		// removed in shadow mode too (R-S5).
		var shbuf [maxStackCandidates]int
		order := shbuf[:0]
		for i := range cands {
			if !verdicts[i].Forced {
				order = append(order, i)
			}
		}
		if len(order) == 0 {
			st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, routes.ActionFailFast).Inc()
			return decision{immediate: immediate(503, typeUnavailable, codeAllOpen,
				fmt.Sprintf("every route of model %q is forced open", m.Name), setHeader("retry-after", strconv.FormatInt(sel.RetryAfterSec, 10)))}
		}
		st.chosen = cands[order[0]]
		st.target = st.comp.targets[st.chosen]
		st.adm, _ = st.target.Acquire(st.s.store, now, true, true)
		st.tracked = true
		d := decision{fallbacks: clusters(cands, order, 1)}
		action := routes.ActionRouted
		if len(sel.Skipped) > 0 || sel.FailFast {
			action = routes.ActionWouldSkip
			d.stage = stageMetadata(routes.ActionWouldSkip, keys(cands, sel.Skipped))
		}
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, action).Inc()
		return d
	}

	if sel.FailFast {
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, routes.ActionFailFast).Inc()
		resp := immediate(503, typeUnavailable, codeAllOpen,
			fmt.Sprintf("every route of model %q is unavailable; retry after %d s", m.Name, sel.RetryAfterSec),
			setHeader("retry-after", strconv.FormatInt(sel.RetryAfterSec, 10)))
		resp.DynamicMetadata = stageMetadata(routes.ActionFailFast, keys(cands, sel.Skipped))
		return decision{immediate: resp}
	}

	// Dispatch to the first candidate that admits; a half-open route whose
	// last slot was taken by a concurrent request is passed over.
	skipped := sel.Skipped
	chosenAt := -1
	for i, idx := range sel.Order {
		t := st.comp.targets[cands[idx]]
		adm, ok := t.Acquire(st.s.store, now, false, !verdicts[idx].Allowed)
		if ok {
			st.adm, chosenAt = adm, i
			break
		}
		skipped = append(skipped, idx)
	}
	if chosenAt < 0 {
		// Every admitting route lost its slot to a race: never fail the
		// request for that; send it to the first one anyway.
		chosenAt = 0
		st.adm, _ = st.comp.targets[cands[sel.Order[0]]].Acquire(st.s.store, now, false, true)
	}
	st.chosen = cands[sel.Order[chosenAt]]
	st.target = st.comp.targets[st.chosen]
	st.tracked = true

	d := decision{fallbacks: clusters(cands, sel.Order, chosenAt+1)}
	if st.s.log.Enabled(context.Background(), slog.LevelDebug) {
		st.s.log.Debug("decision", "gateway", gw.ID, "model", m.Name, "route", st.chosen.Key,
			"skipped", keys(cands, skipped), "try_all", sel.TryAll, "probe", st.adm.Route.Lease != 0)
	}
	action := routes.ActionRouted
	switch {
	case sel.TryAll:
		action = routes.ActionTryAll
		d.stage = stageMetadata(routes.ActionTryAll, keys(cands, unhealthy(verdicts)))
	case len(skipped) > 0:
		action = routes.ActionSkipped
		d.stage = stageMetadata(routes.ActionSkipped, keys(cands, skipped))
	}
	st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, action).Inc()
	return d
}

// clusters joins the clusters of cands[order[from:]] (order nil = all).
func clusters(cands []*routes.Route, order []int, from int) string {
	var b strings.Builder
	if order == nil {
		for i := from + 1; i < len(cands); i++ {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(cands[i].Cluster)
		}
		return b.String()
	}
	for _, idx := range order[from:] {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(cands[idx].Cluster)
	}
	return b.String()
}

func keys(cands []*routes.Route, idx []int) string {
	var b strings.Builder
	for i, x := range idx {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(cands[x].Key)
	}
	return b.String()
}

func unhealthy(v []breaker.Verdict) []int {
	var out []int
	for i := range v {
		if !v[i].Allowed {
			out = append(out, i)
		}
	}
	return out
}
