package processor

import (
	"slices"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
)

// The decision's trace (SPEC §17). With tracing off s.tracer is nil and
// every hook here is that one nil check; with it on, only a request whose
// Envoy context is sampled makes spans.

// maxTraced bounds the decisions whose span waits for an outcome on
// another stream (an entry, an observer, an expiry, an attempt), per
// generation.
const maxTraced = 65536

// traceKey is the decision's span in its fusebox metadata.
const traceKey = "trace"

// tracedGeneration is how long a generation of traced decisions lasts: a
// span is kept one to two of them (past decision_wait_sec's default of
// 300 s an outcome is an expiry, traced by then).
const tracedGeneration = 5 * time.Minute

// tracedDecisions keeps each traced decision's span until its outcome is
// traced, for the streams that record it after the route role's, in two
// generations: a failover decision's attempts each trace under it and
// nothing takes it, so the older generation is let go.
type tracedDecisions struct {
	mu      sync.Mutex
	cur     map[string]*tracing.Span
	prev    map[string]*tracing.Span
	rotated time.Time
	// last is each breaker's latest transition: an outcome's span shows
	// the one its record made (the store reports it with the record's
	// time).
	last map[breaker.ID]breaker.Event
}

func (t *tracedDecisions) put(id string, sp *tracing.Span) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.cur == nil || now.Sub(t.rotated) > tracedGeneration {
		t.prev, t.cur, t.rotated = t.cur, map[string]*tracing.Span{}, now
	}
	if len(t.cur) < maxTraced {
		t.cur[id] = sp
	}
}

func (t *tracedDecisions) get(id string) *tracing.Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sp, ok := t.cur[id]; ok {
		return sp
	}
	return t.prev[id]
}

func (t *tracedDecisions) take(id string) *tracing.Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	sp, ok := t.cur[id]
	if ok {
		delete(t.cur, id)
		return sp
	}
	sp = t.prev[id]
	delete(t.prev, id)
	return sp
}

// OnTransition hears every transition the store reports (mainlib wires it
// when tracing is on).
func (s *Server) OnTransition(e breaker.Event) {
	if s.tracer == nil || e.Saturation != "" {
		return
	}
	t := &s.traced
	t.mu.Lock()
	if t.last == nil {
		t.last = map[breaker.ID]breaker.Event{}
	}
	t.last[e.ID] = e
	t.mu.Unlock()
}

// transitionAt is id's transition reported at now (made by the record
// at now), if any.
func (t *tracedDecisions) transitionAt(id breaker.ID, now int64) (breaker.Event, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.last[id]
	return e, ok && e.At == now
}

// traceDecision starts the decision's span (decide.go), under the context
// Envoy sent on the stream.
func (st *stream) traceDecision(m *routes.Model, cands []*routes.Route, v []breaker.Verdict, order, skipped []int, chosenAt int, action string) {
	s := st.s
	d := tracing.Decision{Start: time.Unix(0, st.startNs), Gateway: st.gw.ID, Model: m.Name, Action: action, ID: st.decisionID,
		Candidates: candidateVerdicts(cands, v, order, skipped, chosenAt, m)}
	if st.chosen != nil {
		d.Route, d.Provider = st.chosen.Key, st.chosen.Provider
		d.DecidedBy = decidedBy(s.store, st.rt.Store.Backend)
		if chosenAt >= 0 && chosenAt < len(order) {
			d.State = v[order[chosenAt]].State.String()
		}
		d.Generation = st.adm.Route.Gen
		if st.chosen.Policy != nil {
			d.PolicyVersion = st.chosen.Policy.Version
		}
	}
	st.span = s.tracer.Decide(st.traceParent, d)
	if st.span != nil && st.decisionID != "" {
		s.traced.put(st.decisionID, st.span)
	}
}

// candidateVerdicts is fusebox.candidates: the plan's order up to the
// chosen route, each "route:verdict", then the model's routes the
// request's residency left out.
func candidateVerdicts(cands []*routes.Route, v []breaker.Verdict, order, skipped []int, chosenAt int, m *routes.Model) []string {
	out := make([]string, 0, len(cands))
	chosen := -1
	if chosenAt >= 0 && chosenAt < len(order) {
		chosen = order[chosenAt]
	}
	passed := make(map[int]bool, len(skipped))
	for _, i := range skipped {
		passed[i] = true
	}
	// Passed over: in the plan's order before the chosen one, or left out
	// of it (skipped).
	for at, i := range order {
		if at < chosenAt {
			passed[i] = true
		}
	}
	for i, r := range cands {
		switch {
		case i == chosen:
			out = append(out, r.Key+":"+tracing.VerdictChosen)
		case passed[i] || chosen < 0:
			out = append(out, r.Key+":"+verdictWord(v[i]))
		}
	}
	for _, r := range m.Candidates(nil) {
		if !slices.Contains(cands, r) {
			out = append(out, r.Key+":"+tracing.VerdictResidency)
		}
	}
	return out
}

// verdictWord is why a candidate was passed over: its breaker's word, or
// floor for a healthy one the plan put after others (max_ejection_percent,
// a recovery ramp's share).
func verdictWord(v breaker.Verdict) string {
	switch {
	case v.ReplicaScoped:
		return tracing.VerdictReplicaOpen
	case v.Forced:
		return tracing.VerdictForced
	case v.Blocked:
		return tracing.VerdictRetryAfter
	case v.State == breaker.HalfOpen:
		return tracing.VerdictHalfOpenFull
	case v.State == breaker.Open:
		return tracing.VerdictOpen
	case v.Saturated:
		return tracing.VerdictSaturated
	case v.RampPermille > 0:
		return tracing.VerdictRamp
	}
	return tracing.VerdictFloor
}

// traceOutcome records what apply recorded as the outcome's span: under
// the attempt's span (failover), or the decision's, whichever stream
// recorded it.
func (st *stream) traceOutcome(route, fleet breaker.Recorded, now int64) {
	s := st.s
	if st.attemptSpan == nil && st.span == nil && st.decisionID == "" {
		return
	}
	o := tracing.Outcome{End: time.Unix(0, now), Route: st.chosen.Key, Class: route.Outcome.Class.String(),
		Reason: route.Outcome.Reason, Origin: route.Outcome.Origin(), Channel: st.traceChannel}
	if o.Channel == "" {
		o.Channel = tracing.ChannelStream
	}
	if st.startNs != 0 {
		o.Start = time.Unix(0, st.startNs)
	}
	for _, id := range []breaker.ID{st.target.Route.ID(), st.target.Fleet.ID()} {
		if e, ok := s.traced.transitionAt(id, now); ok {
			tr := tracing.Transition{At: time.Unix(0, e.At), Route: e.ID.Route, Transition: e.Transition(), Reason: e.Reason,
				Failures: e.Failures, Threshold: e.Threshold}
			if e.OpenUntil > 0 && e.OpenUntil != breaker.Never {
				tr.OpenUntil = time.Unix(0, e.OpenUntil)
			}
			o.Transitions = append(o.Transitions, tr)
		}
	}
	if st.attemptSpan != nil {
		st.attemptSpan.Outcome(o)
		return
	}
	sp := st.span
	if st.decisionID != "" {
		if taken := s.traced.take(st.decisionID); taken != nil {
			sp = taken
		}
	}
	switch {
	case sp != nil:
		sp.Outcome(o)
	case st.traceRef != "":
		// Another replica's decision, named by its metadata: under its
		// span, in its trace.
		s.tracer.OutcomeUnder(st.traceRef, o)
	case st.traceParent.IsValid():
		// The observer's own context: the request's trace.
		s.tracer.OutcomeIn(st.traceParent, o)
	}
}

// decidedBy is the store that decided, as the transition log line names
// it: memory; on Redis, redis, or local while Redis is unreachable and
// this replica's view is the store.
func decidedBy(st breaker.Store, backend string) string {
	if d, ok := st.(interface{ Degraded() bool }); ok {
		if d.Degraded() {
			return breaker.DecidedByLocal
		}
		return breaker.DecidedByRedis
	}
	if backend == "" {
		return "memory"
	}
	return backend
}
