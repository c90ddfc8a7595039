package processor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

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
		st.s.metrics.Decisions.WithLabelValues(gw.ID, "", ActionRejected).Inc()
		return decision{immediate: st.errorReply(404, typeInvalidRequest, codeModelUnknown,
			fmt.Sprintf("model %q is not served by gateway %q", echoName(st.modelName), gw.ID))}
	}
	st.model = m
	cands := m.Candidates(st.residency)
	if len(cands) == 0 {
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, ActionRejected).Inc()
		return decision{immediate: immediate(404, typeInvalidRequest, codeModelUnknown,
			fmt.Sprintf("model %q has no route with residency %q", m.Name, echoName(strings.Join(st.residency, ","))))}
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
		st.s.metrics.Decisions.WithLabelValues(gw.ID, m.Name, ActionRouted).Inc()
		return decision{fallbacks: clusters(cands, nil, 0)}
	}
	var ramp Ramp
	if pk.anyRamp {
		ramp = &liveRamp{st: st, cands: cands, v: pk.verdicts, now: now}
	}
	plan := PlanRoutes(now, pk.verdicts, pol.MaxEjectionPercent, pol.WhenAllOpen, ramp, obuf[:0], sbuf[:0])
	if plan.FailFast {
		return st.failFast(m, cands, plan.Selection, now)
	}
	skipped, chosenAt := st.admit(cands, pk.verdicts, plan, now)
	idx := plan.Order[chosenAt]
	st.chosen = cands[idx]
	st.target = st.comp.targets[st.chosen]
	st.tracked = !pk.off[idx]
	if st.tracked && st.decisionID == "" {
		st.decisionID = newDecisionID()
	}
	d := decision{fallbacks: clusters(cands, plan.Order, chosenAt+1)}
	var would string
	if pk.anyWould {
		would = keys(cands, flagged(pk.wouldSkip))
	}
	if st.s.log.Enabled(context.Background(), slog.LevelDebug) {
		st.s.log.Debug("decision", "gateway", gw.ID, "model", m.Name, "route", st.chosen.Key,
			"skipped", keys(cands, skipped), "would_skip", would, "try_all", plan.TryAll, "probe", st.adm.Route.Lease != 0)
	}
	action, stage := stageOfPlan(cands, pk, plan, skipped, would)
	d.stage = stage
	if st.rt.Envoy.Failover {
		st.withChainOf(&d, action, cands, pk.verdicts, plan.Order, chosenAt, m.MaxAttempts, now)
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
func stageOfPlan(cands []*routes.Route, pk peeked, plan Plan, skipped []int, would string) (string, *structpb.Struct) {
	switch {
	case plan.TryAll:
		return ActionTryAll, stageMetadata(ActionTryAll, keys(cands, unhealthy(pk.verdicts)), would)
	case len(skipped) > 0:
		if len(plan.Saturated) > 0 {
			skipped = mergeIndices(skipped, plan.Saturated)
		}
		return ActionSkipped, stageMetadata(ActionSkipped, keys(cands, skipped), would)
	case len(plan.Saturated) > 0:
		return ActionSaturated, stageMetadata(ActionSaturated, keys(cands, plan.Saturated), would)
	case len(plan.Ramped) > 0:
		return ActionRamped, stageMetadata(ActionRamped, keys(cands, plan.Ramped), would)
	case pk.anyWould:
		// R-M2/R-M4: shadow breakers would have skipped these; they were
		// not skipped.
		return ActionWouldSkip, stageMetadata(ActionWouldSkip, would, "")
	}
	return ActionRouted, nil
}

// mergeIndices is a and b in routing order (both sorted), each once.
func mergeIndices(a, b []int) []int {
	out := append(append(make([]int, 0, len(a)+len(b)), a...), b...)
	sort.Ints(out)
	return slices.Compact(out)
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
// held while the route is slow (baseline.go), and the draw of this
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
		share = base.rampShare(share, r.cands[i].Policy.BaselineMultiplier, r.now)
	}
	return share
}

func (r *liveRamp) Draw(i int) uint16 {
	if r.st.decisionID == "" {
		r.st.decisionID = newDecisionID()
	}
	return RampDraw(r.st.decisionID, r.cands[i].Key)
}

// failFast answers a model with no route left under fail_fast (R-F3).
func (st *stream) failFast(m *routes.Model, cands []*routes.Route, sel Selection, now int64) decision {
	st.s.metrics.Decisions.WithLabelValues(st.gw.ID, m.Name, ActionFailFast).Inc()
	st.journalDecided(m, cands, nil, ActionFailFast, now)
	hdrs := []*corev3.HeaderValueOption{setHeader("retry-after", strconv.FormatInt(sel.RetryAfterSec, 10))}
	if !m.Policy.FailFastClientRetry {
		// The official SDKs otherwise sleep up to 60 s on retry-after
		// and retry twice: a fast failure that takes two minutes (R-F3).
		hdrs = append(hdrs, setHeader("x-should-retry", "false"))
	}
	resp := st.errorReply(503, typeUnavailable, codeAllOpen,
		fmt.Sprintf("every route of model %q is unavailable; retry after %d s", m.Name, sel.RetryAfterSec), hdrs...)
	resp.DynamicMetadata = stageMetadata(ActionFailFast, keys(cands, sel.Skipped), "")
	return decision{immediate: resp}
}

// admit takes the plan's first route that admits, from plan.Start: a
// half-open route whose last slot a concurrent request took is passed over
// (and listed as skipped). It sets st.adm and returns where in plan.Order
// the request goes.
func (st *stream) admit(cands []*routes.Route, v []breaker.Verdict, plan Plan, now int64) (skipped []int, chosenAt int) {
	ctx := context.Background()
	skipped = plan.Skipped
	for i := plan.Start; i < len(plan.Order); i++ {
		idx := plan.Order[i]
		adm, ok := st.comp.targets[cands[idx]].Acquire(ctx, st.s.store, now, !v[idx].Allowed)
		if ok {
			st.adm = adm
			return skipped, i
		}
		skipped = append(skipped, idx)
	}
	// Every admitting route lost its slot to a race: never fail the
	// request for that; send it to the first one anyway.
	st.adm, _ = st.comp.targets[cands[plan.Order[0]]].Acquire(ctx, st.s.store, now, true)
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
	idx := chainOf(cands, v, order, chosenAt, max(maxAttempts, 1))
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
	d.stage = withChain(d.stage, action, cands, kept)
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
	d.stage = withDecision(d.stage, st.decisionID)
	// The model and gateway, for the access log line a replay reads
	// (R-R1, R-R8) and for an NC/UH entry of a chain (R-AL5).
	ns := d.stage.Fields["fusebox"].GetStructValue().Fields
	ns["model"] = structpb.NewStringValue(m.Name)
	ns["gateway"] = structpb.NewStringValue(st.gw.ID)
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

// chainOf is the failover chain (R-X1): the dispatched route first, then
// the other remaining candidates in routing order that are closed and
// unblocked, at most max groups.
func chainOf(cands []*routes.Route, v []breaker.Verdict, order []int, chosenAt, max int) []int {
	idx := []int{order[chosenAt]}
	for _, i := range order[chosenAt+1:] {
		if len(idx) == max {
			break
		}
		// Only the first group may be a half-open route (its admitted
		// probe); later ones must be healthy.
		if v[i].Allowed && v[i].State == breaker.Closed {
			idx = append(idx, i)
		}
	}
	return idx
}

// withChain writes the chain idx of cands as Envoy's
// PriorityGroupsOverride in namespace fusebox.failover; the stage gains
// chain.
func withChain(stage *structpb.Struct, action string, cands []*routes.Route, idx []int) *structpb.Struct {
	groups := make([]any, 0, len(idx))
	for _, i := range idx {
		groups = append(groups, map[string]any{
			"name":     cands[i].Key,
			"clusters": []any{map[string]any{"cluster_name": cands[i].Cluster, "weight": 1}},
		})
	}
	if stage == nil {
		stage = stageMetadata(action, "", "")
	}
	chain := keys(cands, idx)
	stage.Fields["fusebox"].GetStructValue().Fields["chain"] = structpb.NewStringValue(chain)
	override, err := structpb.NewStruct(map[string]any{"priority_groups": groups})
	if err == nil {
		stage.Fields[failoverNamespace] = structpb.NewStructValue(override)
	}
	return stage
}

// failoverNamespace is the dynamic metadata namespace of the chain, read
// by Envoy's priority_group specifier (override_metadata_namespace).
const failoverNamespace = "fusebox.failover"

func flagged(f []bool) []int {
	var out []int
	for i, v := range f {
		if v {
			out = append(out, i)
		}
	}
	return out
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

// RampDraw maps a decision to 0..999 for route key (FNV-1a): the same
// decision always draws the same, and routes draw independently.
func RampDraw(decision, key string) uint16 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(decision); i++ {
		h ^= uint64(decision[i])
		h *= 1099511628211
	}
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return uint16(h % 1000)
}
