package processor

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
	"github.com/fusebox-llm/fusebox/pkg/plan"
	"github.com/fusebox-llm/fusebox/pkg/tracing"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// decision is the outcome of choosing a route for a request.
type decision struct {
	immediate *extprocv3.ProcessingResponse // a local reply instead of a dispatch
	fallbacks string                        // remaining candidate clusters, comma-separated
	stage     *structpb.Struct
	// attempt is the chain for the attempt role (AttemptHeader); "" when
	// failover is off.
	attempt string
	// retries bounds Envoy's retries of this request (x-envoy-max-retries):
	// one attempt per route of the chain, never more than max_attempts.
	retries int
}

// chainGroup is one route of a failover chain with its admission.
type chainGroup struct {
	route *routes.Route
	adm   breaker.TargetAdmission
}

// maxStackCandidates bounds the candidates decided on stack buffers.
const maxStackCandidates = 8

// decide applies R-D1..R-D3, R-F2, R-F3 and R-M1..R-M3 for st.modelName and
// sets st.chosen, st.target and st.adm.
func (st *stream) decide() decision {
	gw := st.gw
	m, ok := gw.Model(st.modelName)
	if !ok {
		st.s.metrics.Decisions.WithLabelValues(gw.ID, "", plan.ActionRejected).Inc()
		return decision{immediate: st.errorReply(404, extproc.TypeInvalidRequest, extproc.CodeModelUnknown,
			fmt.Sprintf("model %q is not served by gateway %q", extproc.EchoName(st.modelName), gw.ID))}
	}
	st.model = m
	st.noteFingerprint(st.reqBody)
	cands := m.Candidates(st.residency)
	if len(cands) == 0 {
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, plan.ActionRejected).Inc()
		return decision{immediate: extproc.Immediate(404, extproc.TypeInvalidRequest, extproc.CodeModelUnknown,
			fmt.Sprintf("model %q has no route with residency %q", m.Name, extproc.EchoName(strings.Join(st.residency, ","))))}
	}
	st.first = cands[0]
	pol := m.Policy

	// Each candidate is checked once (R-D2), through the store, with its
	// own breakers' modes (R-M4).
	now := st.startNs
	var vbuf [maxStackCandidates]breaker.Verdict
	var wbuf, fbuf [maxStackCandidates]bool
	var obuf, sbuf [maxStackCandidates]int
	pk := st.peekAll(cands, now, peeked{verdicts: vbuf[:0], wouldSkip: wbuf[:0], off: fbuf[:0]})
	if !pk.anyActive {
		// R-M1: nothing consulted or recorded, still dispatched.
		st.chosen = cands[0]
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, plan.ActionRouted).Inc()
		return decision{fallbacks: plan.Clusters(cands, nil, 0)}
	}
	var ramp plan.Ramp
	if pk.anyRamp {
		ramp = &liveRamp{st: st, cands: cands, v: pk.verdicts, now: now}
	}
	pl := plan.PlanRoutes(now, pk.verdicts, pol.MaxEjectionPercent, pol.WhenAllOpen, ramp, obuf[:0], sbuf[:0])
	if pl.FailFast {
		return st.failFast(m, cands, pk.verdicts, pl.Selection, now)
	}
	skipped, chosenAt := st.admit(cands, pk.verdicts, pl, now)
	idx := pl.Order[chosenAt]
	st.chosen = cands[idx]
	st.target = st.comp.targets[st.chosen]
	st.tracked = !pk.off[idx]
	if st.tracked && st.decisionID == "" {
		st.decisionID = lifecycle.NewDecisionID()
	}
	d := decision{fallbacks: plan.Clusters(cands, pl.Order, chosenAt+1)}
	var would string
	if pk.anyWould {
		would = plan.Keys(cands, plan.Flagged(pk.wouldSkip))
	}
	if st.s.log.Enabled(context.Background(), slog.LevelDebug) {
		st.s.log.Debug("decision", "gateway", gw.ID, "model", m.Name, "route", st.chosen.Key,
			"skipped", plan.Keys(cands, skipped), "would_skip", would, "try_all", pl.TryAll, "probe", st.adm.Route.Lease != 0)
	}
	action, stage := stageOfPlan(cands, pk, pl, skipped, would)
	d.stage = stage
	if st.rt.Envoy.Failover {
		st.withChainOf(&d, action, cands, pk.verdicts, pl.Order, chosenAt, m.MaxAttempts, now)
	}
	if st.s.tracer != nil {
		// Before keepDecision: the decision's metadata names its span.
		st.traceDecision(m, cands, pk.verdicts, pl.Order, skipped, chosenAt, action)
	}
	if st.tracked {
		st.keepDecision(&d, m)
	}
	st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, action).Inc()
	st.journalDecided(m, cands, st.chosen, action, now)
	return d
}

// stageOfPlan is the decision's action and the stage metadata that names
// it (nil for a plain route).
func stageOfPlan(cands []*routes.Route, pk peeked, pl plan.Plan, skipped []int, would string) (string, *structpb.Struct) {
	switch {
	case pl.TryAll:
		return plan.ActionTryAll, extproc.StageMetadata(plan.ActionTryAll, plan.Keys(cands, plan.Unhealthy(pk.verdicts)), would)
	case len(skipped) > 0:
		if len(pl.Saturated) > 0 {
			skipped = plan.MergeIndices(skipped, pl.Saturated)
		}
		return plan.ActionSkipped, extproc.StageMetadata(plan.ActionSkipped, plan.Keys(cands, skipped), would)
	case len(pl.Saturated) > 0:
		return plan.ActionSaturated, extproc.StageMetadata(plan.ActionSaturated, plan.Keys(cands, pl.Saturated), would)
	case len(pl.Ramped) > 0:
		return plan.ActionRamped, extproc.StageMetadata(plan.ActionRamped, plan.Keys(cands, pl.Ramped), would)
	case pk.anyWould:
		// R-M2/R-M4: shadow breakers would have skipped these; they were
		// not skipped.
		return plan.ActionWouldSkip, extproc.StageMetadata(plan.ActionWouldSkip, would, "")
	}
	return plan.ActionRouted, nil
}

// peeked is what the candidates' breakers say now.
type peeked struct {
	verdicts                     []breaker.Verdict
	wouldSkip, off               []bool
	anyActive, anyWould, anyRamp bool
}

// peekAll checks each candidate once (R-D2), through the store.
func (st *stream) peekAll(cands []*routes.Route, now int64, pk peeked) peeked {
	ctx := context.Background()
	for _, r := range cands {
		tv := st.comp.targets[r].Peek(ctx, st.s.store, now)
		pk.verdicts = append(pk.verdicts, tv.Verdict)
		ws := tv.WouldSkip && tv.Allowed
		pk.wouldSkip = append(pk.wouldSkip, ws)
		pk.off = append(pk.off, tv.Off)
		pk.anyActive = pk.anyActive || !tv.Off
		pk.anyWould = pk.anyWould || ws
		pk.anyRamp = pk.anyRamp || tv.Verdict.RampPermille > 0
	}
	return pk
}

// liveRamp is the ramp as a live decision sees it: the breaker's share,
// held while the route is slow (judge/baseline.go), and the draw of this
// decision's id (deterministic for replay).
type liveRamp struct {
	st    *stream
	cands []*routes.Route
	v     []breaker.Verdict
	now   int64
}

func (r *liveRamp) Share(i int) uint16 {
	share := r.v[i].RampPermille
	if base := r.st.comp.bases[r.cands[i]]; share > 0 && base != nil {
		share = base.RampShare(share, r.cands[i].Policy.BaselineMultiplier, r.now)
	}
	return share
}

func (r *liveRamp) Draw(i int) uint16 {
	if r.st.decisionID == "" {
		r.st.decisionID = lifecycle.NewDecisionID()
	}
	return plan.RampDraw(r.st.decisionID, r.cands[i].Key)
}

// failFast answers a model with no route left under fail_fast (R-F3).
func (st *stream) failFast(m *routes.Model, cands []*routes.Route, v []breaker.Verdict, sel plan.Selection, now int64) decision {
	st.s.metrics.Decisions.WithLabelValues(st.gw.ID, m.Name, plan.ActionFailFast).Inc()
	st.journalDecided(m, cands, nil, plan.ActionFailFast, now)
	if st.s.tracer != nil {
		st.traceDecision(m, cands, v, nil, sel.Skipped, -1, plan.ActionFailFast)
		st.span.End(time.Unix(0, now))
	}
	hdrs := []*corev3.HeaderValueOption{extproc.SetHeader("retry-after", strconv.FormatInt(sel.RetryAfterSec, 10))}
	if !m.Policy.FailFastClientRetry {
		// The official SDKs otherwise sleep up to 60 s on retry-after
		// and retry twice: a fast failure that takes two minutes (R-F3).
		hdrs = append(hdrs, extproc.SetHeader("x-should-retry", "false"))
	}
	resp := st.errorReply(503, extproc.TypeUnavailable, extproc.CodeAllOpen,
		fmt.Sprintf("every route of model %q is unavailable; retry after %d s", m.Name, sel.RetryAfterSec), hdrs...)
	resp.DynamicMetadata = extproc.StageMetadata(plan.ActionFailFast, plan.Keys(cands, sel.Skipped), "")
	return decision{immediate: resp}
}

// admit takes the plan's first route that admits, from pl.Start: a
// half-open route whose last slot a concurrent request took is passed over
// (and listed as skipped). It sets st.adm and returns where in pl.Order
// the request goes.
func (st *stream) admit(cands []*routes.Route, v []breaker.Verdict, pl plan.Plan, now int64) (skipped []int, chosenAt int) {
	ctx := context.Background()
	skipped = pl.Skipped
	for i := pl.Start; i < len(pl.Order); i++ {
		idx := pl.Order[i]
		adm, ok := st.comp.targets[cands[idx]].Acquire(ctx, st.s.store, now, !v[idx].Allowed)
		if ok {
			st.adm = adm
			return skipped, i
		}
		skipped = append(skipped, idx)
	}
	// Every admitting route lost its slot to a race: never fail the
	// request for that; send it to the first one anyway.
	st.adm, _ = st.comp.targets[cands[pl.Order[0]]].Acquire(ctx, st.s.store, now, true)
	return skipped, 0
}

// withChainOf adds the failover chain (envoy.failover, R-X8), always:
// there Envoy's priority_group specifier, not the cluster header, picks
// the cluster (it would fall back to its configured group without
// fusebox's override), and the attempt role records every attempt, even a
// single one. Elsewhere (envoy.yaml) the reply carries no chain whatever
// max_attempts says (a load warning says so).
//
// The attempt role records each attempt with the generation the route had
// now; the first group is the dispatched route with its admission (and
// probe slot). A later group is admitted now: one the store refuses, or
// one that turned half-open since its Peek (only the first group may hold
// a probe slot, R-X1), is left out and its slot given back, so no lease
// outlives the decision. The metadata is written from the groups kept, so
// the two agree.
func (st *stream) withChainOf(d *decision, action string, cands []*routes.Route, v []breaker.Verdict, order []int, chosenAt, maxAttempts int, now int64) {
	ctx := context.Background()
	idx := plan.ChainOf(cands, v, order, chosenAt, max(maxAttempts, 1))
	groups := make([]chainGroup, 0, len(idx))
	groups = append(groups, chainGroup{route: st.chosen, adm: st.adm})
	kept := idx[:1]
	for _, i := range idx[1:] {
		t := st.comp.targets[cands[i]]
		adm, ok := t.Acquire(ctx, st.s.store, now, false)
		if !ok {
			continue
		}
		if adm.Route.Lease != 0 || adm.Fleet.Lease != 0 {
			t.Release(ctx, st.s.store, adm)
			continue
		}
		groups = append(groups, chainGroup{route: cands[i], adm: adm})
		kept = append(kept, i)
	}
	d.stage = plan.WithChain(d.stage, action, cands, kept)
	d.attempt = st.chainToken(groups)
	// The entry of a no-host reply names its routes only through this
	// sealed copy (R-AL5): no attempt stream exists to record it.
	d.stage.Fields["fusebox"].GetStructValue().Fields[tokenKey] = structpb.NewStringValue(d.attempt)
	d.retries = len(groups) - 1
	st.handedOver = true
}

// keepDecision names a tracked decision in the reply's metadata and, when
// the route role settles it (not handed to the attempt role), keeps it in
// the decision table (decisions.go).
func (st *stream) keepDecision(d *decision, m *routes.Model) {
	d.stage = extproc.WithDecision(d.stage, st.decisionID)
	// The model and gateway, for the access log line a replay reads
	// (R-R1, R-R8) and for an NC/UH entry of a chain (R-AL5).
	ns := d.stage.Fields["fusebox"].GetStructValue().Fields
	ns["model"] = structpb.NewStringValue(m.Name)
	ns["gateway"] = structpb.NewStringValue(st.gw.ID)
	// Whose egress, and which request (R-FD5): replay holds a replica's
	// local failures for a quorum of replicas, and judges request faults
	// by the fingerprint (keyed: never the body) and whether it was sent
	// again, as live did.
	ns["replica"] = st.s.replicaName
	if st.hasFP {
		ns["fp"] = structpb.NewStringValue(st.fp.Logged())
		if st.again() {
			ns["again"] = structpb.NewBoolValue(true)
		}
	}
	if st.span != nil {
		// The decision's span (W3C traceparent), for an outcome that
		// another replica records from the access log entry (R-TR3).
		ns[traceKey] = structpb.NewStringValue(tracing.Traceparent(st.span.Context()))
	}
	if st.handedOver {
		return
	}
	st.s.decisions.add(st)
	st.kept = true
	if st.rt.Envoy.Observer {
		d.stage = withObserve(d.stage, st.chosen.Key, st.observeNote())
	}
}

// journalDecided tells the transition journal what handled this request
// (R-API7: the timeline's "next request"). Nothing is built unless a
// transition waits for it: on the healthy path it is one atomic load.
func (st *stream) journalDecided(m *routes.Model, cands []*routes.Route, chosen *routes.Route, action string, now int64) {
	j := st.s.journal
	if !j.Waiting() {
		return
	}
	key := ""
	if chosen != nil {
		key = chosen.Key
	}
	j.Decided(st.gw.ID, m.Name, key, action, func(k string) bool {
		for _, r := range cands {
			if r.Key == k {
				return true
			}
		}
		return false
	}, now)
}
