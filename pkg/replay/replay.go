package replay

import (
	"container/heap"
	"context"
	"encoding/json"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/plan"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// RouteReport is what one config did with one route's traffic.
type RouteReport struct {
	Gateway string `json:"gateway"`
	Model   string `json:"model"`
	Route   string `json:"route"`
	// Opens is how many times the breaker opened; OpenSec how long it was
	// open in all.
	Opens   int     `json:"opens"`
	OpenSec float64 `json:"open_sec"`
	// Served: requests the config sent to the route. Rerouted: requests
	// that went to this route live and the config sent elsewhere.
	Served   int `json:"served"`
	Rerouted int `json:"rerouted"`
	// MetFailing: requests the config sent here that failed (measured, or
	// estimated when the route did not serve them live).
	MetFailing          int `json:"met_failing"`
	MetFailingEstimated int `json:"met_failing_estimated"`
	// Saturated: requests the config passed over this route because its
	// quota headroom was below the floor (R-H2, R-H5).
	Saturated int `json:"saturated"`
	// Whose failures (R-FD5): the failures of requests sent here that
	// Envoy originated (no answer came) and that the provider answered;
	// HeldForQuorum the local ones held until enough replicas saw such
	// failures (they counted for their replica's own view only);
	// RequestFaults the upstream ones judged the request's own; and
	// ReplicaOpens how often a replica's own view of the route opened.
	LocalFailures    int `json:"local_failures"`
	UpstreamFailures int `json:"upstream_failures"`
	HeldForQuorum    int `json:"held_for_quorum"`
	RequestFaults    int `json:"request_faults"`
	ReplicaOpens     int `json:"replica_opens"`
	// Cost is what the requests the config sent here cost, from the
	// tokens the log holds and the route's cost_per_mtok (estimated for
	// requests it did not serve live: their tokens were another route's).
	Cost          float64 `json:"cost"`
	CostEstimated float64 `json:"cost_estimated"`
	// Transitions lists every transition with its time (unix seconds);
	// Bands the spans the breaker was open (or half-open), and Failures
	// when requests met it failing (at most maxMarks), for the timeline.
	Transitions []Transition `json:"transitions"`
	Bands       []Band       `json:"bands"`
	Failures    []float64    `json:"failures"`
	openedAt    int64
}

// Band is a span in one state.
type Band struct {
	From, To float64
	State    string
}

// rfc3339 writes unix seconds as an RFC 3339 time, to the millisecond, UTC.
func rfc3339(sec float64) string {
	return time.UnixMilli(int64(math.Round(sec * 1000))).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// MarshalJSON writes the band's times in RFC 3339 (R-R7).
func (b Band) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		From  string `json:"from"`
		To    string `json:"to"`
		State string `json:"state"`
	}{rfc3339(b.From), rfc3339(b.To), b.State})
}

// maxMarks bounds the failures kept per route for the timeline.
const maxMarks = 2000

// bands are the spans the route's breaker (the fleet's, not a replica's
// egress view) was not closed.
func (rr *RouteReport) bands(end float64) {
	var fleet []Transition
	for _, t := range rr.Transitions {
		if t.Replica == "" {
			fleet = append(fleet, t)
		}
	}
	for i, t := range fleet {
		_, to, _ := strings.Cut(t.Change, "->")
		if to == "closed" {
			continue
		}
		until := end
		if i+1 < len(fleet) {
			until = fleet[i+1].At
		}
		rr.Bands = append(rr.Bands, Band{From: t.At, To: until, State: to})
	}
}

// Transition is one state change in the replay.
type Transition struct {
	At     float64 `json:"at"` // unix seconds; RFC 3339 in JSON
	Change string  `json:"change"`
	Reason string  `json:"reason"`
	// Origin is the evidence's origin, as live (R-FD1, R-FD5;
	// breaker.TransitionOrigin).
	Origin string `json:"origin,omitempty"`
	// Replica names the replica whose own egress view changed (scope
	// replica, R-FD3); "" for the route's breaker, every replica's.
	Replica string `json:"replica,omitempty"`
}

// MarshalJSON writes the time in RFC 3339 (R-R7).
func (t Transition) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		At      string `json:"at"`
		Change  string `json:"change"`
		Reason  string `json:"reason"`
		Origin  string `json:"origin,omitempty"`
		Scope   string `json:"scope,omitempty"`
		Replica string `json:"replica,omitempty"`
	}{rfc3339(t.At), t.Change, t.Reason, t.Origin, t.scope(), t.Replica})
}

// scope is "replica" for a replica's egress view's transition.
func (t Transition) scope() string {
	if t.Replica != "" {
		return "replica"
	}
	return ""
}

// Report is one replay's result.
//
// Its JSON is one snake_case schema (docs/replay.md): every field below
// by the name its tag gives, times in RFC 3339.
type Report struct {
	Lines     int `json:"lines"`
	Malformed int `json:"malformed"`
	Skipped   int `json:"skipped"` // a gateway or model the config lacks
	// EarlyOutcomes: outcomes recorded before their time had come, because
	// more than 65,536 requests were in flight at once (R-R6's bound).
	EarlyOutcomes int `json:"early_outcomes,omitempty"`
	// MalformedWhy counts the malformed lines by reason; MalformedExamples
	// names the first few (file:line: reason).
	MalformedWhy      map[string]int `json:"malformed_why,omitempty"`
	MalformedExamples []string       `json:"malformed_examples,omitempty"`
	// ClientErrors are the requests that would have failed at the client
	// (an error status, or fail_fast); Estimated those of them whose
	// outcome was estimated.
	ClientErrors          int `json:"client_errors"`
	ClientErrorsEstimated int `json:"client_errors_estimated"`
	// Live is what happened: the client errors the log shows, and the cost
	// of the tokens it holds on the routes that served them.
	LiveClientErrors int     `json:"live_client_errors"`
	LiveCost         float64 `json:"live_cost"`
	// Avoided and Added compare the config with what happened, request by
	// request (estimated where the config changed the route).
	Avoided int `json:"avoided"`
	Added   int `json:"added"`
	// Headroom is what the config's headroom policy (R-H2) did, evaluated
	// on the quota each response announced (R-H5): requests it moved off a
	// saturated route, and the 429s of those that it avoided.
	HeadroomMoved       int            `json:"headroom_moved"`
	HeadroomAvoided429s int            `json:"headroom_avoided_429s"`
	Routes              []*RouteReport `json:"routes"`
	byKey               map[string]*RouteReport
}

func (r *Report) route(gw, model, key string) *RouteReport {
	k := gw + "|" + key
	if rr, ok := r.byKey[k]; ok {
		if rr.Model == "" {
			rr.Model = model
		}
		return rr
	}
	rr := &RouteReport{Gateway: gw, Model: model, Route: key, Transitions: []Transition{}, Bands: []Band{}, Failures: []float64{}}
	r.byKey[k] = rr
	r.Routes = append(r.Routes, rr)
	return rr
}

// engine replays lines under one config.
type engine struct {
	rt      *routes.Runtime
	st      *breaker.Memory
	targets map[*routes.Route]*breaker.Target
	rep     *Report
	// observed is each route's latest logged result (its health as the
	// log saw it), for requests it did not serve live.
	observed map[observedKey]breaker.Result
	// reached: the clusters earlier lines named (bounded like live's).
	reached map[string]struct{}
	now     int64
	queue   outcomes
	seq     int
	vbuf    []breaker.Verdict
	ramp    replayRamp
	obuf    []int
	sbuf    []int
	// fd judges whose failure each is (domains.go, R-FD5).
	fd *domains
}

// Run replays log under rt on the lines' own clock, as one queue of events
// in time order (R-R4): each request is decided at its start and its
// outcome recorded at start + duration, as fusebox recorded it live; a
// request that starts while an earlier one is still running sees the
// breaker as that one left it (not as it would be had the outcome been
// known at the start). Before, each outcome was recorded at its request's
// start: replaying the live config on its own log (10 s timeouts,
// threshold 3) opened at t+2 s instead of t+12 s, and every what-if report
// overstated a tighter policy.
func Run(rt *routes.Runtime, src Source) *Report {
	rep, _ := RunErr(rt, src)
	return rep
}

// RunErr is Run, with the error a Source read can fail with.
func RunErr(rt *routes.Runtime, src Source) (*Report, error) {
	e := &engine{rt: rt, targets: map[*routes.Route]*breaker.Target{}, observed: map[observedKey]breaker.Result{}, reached: map[string]struct{}{},
		rep: &Report{byKey: map[string]*RouteReport{}}}
	e.st = breaker.NewMemory(e.event)
	e.install()
	err := src.Each(func(l *Line) {
		e.flush(l.At)
		e.now = l.At
		e.decide(l)
	})
	e.flush(math.MaxInt64)
	e.finish()
	e.rep.Lines, e.rep.Malformed, e.rep.MalformedWhy, e.rep.MalformedExamples = src.Counts()
	return e.rep, err
}

// outcome is a request's result, recorded when it ended.
type outcome struct {
	at        int64
	seq       int // decision order: equal times record in it
	t         *breaker.Target
	adm       breaker.TargetAdmission
	res       breaker.Result
	rr        *RouteReport
	estimated bool
	// For domains.go: the route, the line's replica, fingerprint and
	// whether it was sent again, and the replica's egress view's probe.
	route   *routes.Route
	replica string
	fp      judge.Fingerprint
	hasFP   bool
	again   bool
	eadm    breaker.Admission
	eheld   bool
}

// outcomes is the queue of outcomes not yet recorded (a min-heap by time).
type outcomes []outcome

func (q outcomes) Len() int { return len(q) }
func (q outcomes) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q outcomes) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *outcomes) Push(x any)   { *q = append(*q, x.(outcome)) }
func (q *outcomes) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// maxInFlight bounds the outcomes waiting for their request's end (about
// 200 bytes each: 13 MiB).
const maxInFlight = 1 << 16

// flushOne records the outcome that ends first.
func (e *engine) flushOne() {
	if e.queue.Len() > 0 {
		now := e.now
		e.recordNext()
		e.now = now
	}
}

// flush records every outcome that ended by until, in time order.
func (e *engine) flush(until int64) {
	for e.queue.Len() > 0 && e.queue[0].at <= until {
		e.recordNext()
	}
}

// recordNext records the outcome that ends first.
func (e *engine) recordNext() {
	o := heap.Pop(&e.queue).(outcome)
	e.now = o.at
	res := o.res
	if o.route != nil {
		res = e.fd.judge(&o, o.route, res)
	}
	route, _, _ := o.t.Record(context.Background(), e.st, o.at, o.adm, res)
	if route.Applied && route.Outcome.Class == breaker.Failure {
		o.rr.MetFailing++
		if len(o.rr.Failures) < maxMarks {
			o.rr.Failures = append(o.rr.Failures, float64(o.at)/1e9)
		}
		if o.estimated {
			o.rr.MetFailingEstimated++
		}
	}
}

// maxReplayClusters bounds the clusters replay remembers lines reaching.
const maxReplayClusters = 4096

// observedKey is a gateway's route.
type observedKey struct{ gateway, route string }

// replayRamp is the ramp as replay draws it: the breaker's share and the
// same draw of the decision id as the live decision made (R-D8).
type replayRamp struct {
	v        []breaker.Verdict
	cands    []*routes.Route
	decision string
}

func (r replayRamp) Share(i int) uint16 { return r.v[i].RampPermille }
func (r replayRamp) Draw(i int) uint16  { return plan.RampDraw(r.decision, r.cands[i].Key) }

// decide routes one request at its start with the live decision's plan
// (plan.PlanRoutes) and queues its outcome for its end.
func (e *engine) decide(l *Line) {
	ctx := context.Background()
	gwID := l.Gateway
	if gwID == "" {
		gwID = "default"
	}
	gw, ok := e.rt.Gateway(gwID)
	if !ok {
		e.rep.Skipped++
		return
	}
	m, ok := gw.Model(l.Model)
	if !ok {
		e.rep.Skipped++
		return
	}
	cands := m.Candidates(nil)
	live := liveRoute(cands, l)
	res := resultOf(l)
	if l.Cluster != "" && len(e.reached) < maxReplayClusters {
		e.reached[l.Cluster] = struct{}{}
	}
	if live != nil {
		// As live (processor/reached.go): a retry's no-host reply to a
		// cluster no earlier line reached is a missing cluster.
		_, reached := e.reached[live.Cluster]
		if judge.RetryToUnknownCluster(judge.NamedFlags(l.Flags), l.Attempts, reached) {
			res = judge.AsClusterNotFound(res)
		}
	}
	liveErr := clientError(res)
	if liveErr {
		e.rep.LiveClientErrors++
	}
	if live != nil {
		e.observed[observedKey{gwID, live.Key}] = res
		e.rep.LiveCost += float64(l.Tokens) * live.CostPerMtok / 1e6
	}
	e.fd.saw(l.Replica, l.At)
	e.vbuf = e.vbuf[:0]
	for _, c := range cands {
		t := e.targets[c]
		e.vbuf = append(e.vbuf, e.fd.peek(l.Replica, t.Route, l.At, t.Peek(ctx, e.st, l.At).Verdict))
	}
	// A pointer the engine holds: a value would be boxed for the
	// interface on every line.
	e.ramp = replayRamp{v: e.vbuf, cands: cands, decision: l.Decision}
	plan := plan.PlanRoutes(l.At, e.vbuf, m.Policy.MaxEjectionPercent, m.Policy.WhenAllOpen,
		&e.ramp, e.obuf[:0], e.sbuf[:0])
	e.obuf, e.sbuf = plan.Order, plan.Skipped
	if plan.FailFast || len(plan.Order) == 0 {
		e.rep.ClientErrors++
		if !liveErr {
			e.rep.Added++
		}
		if live != nil {
			e.rep.route(gwID, m.Name, live.Key).Rerouted++
		}
		return
	}
	chosen := cands[plan.Order[plan.Start]]
	rr := e.rep.route(gwID, m.Name, chosen.Key)
	rr.Served++
	estimated := chosen != live
	if live != nil && estimated && passedOver(plan.Saturated, cands, live) {
		// The headroom policy moved it off the live route (R-H5).
		e.rep.HeadroomMoved++
		e.rep.route(gwID, m.Name, live.Key).Saturated++
		if l.Code == 429 {
			e.rep.HeadroomAvoided429s++
		}
	}
	if !estimated {
		// The quota the live route's provider announced on this response:
		// the candidate, sending it there too, reads the same (R-H5).
		h := judge.LoggedHeadroom(l.RateLimit[0], l.RateLimit[1], l.RateLimit[2], l.RateLimit[3], time.Unix(0, l.At))
		if h.Announced() {
			res.SaturateUntil, res.Unsaturate = judge.Saturation(h, chosen.Policy.Headroom, l.At)
			res.DecidedAt = l.At // R-H7, as live
		}
	}
	if estimated {
		if live != nil {
			e.rep.route(gwID, m.Name, live.Key).Rerouted++
		}
		if o, ok := e.observed[observedKey{gwID, chosen.Key}]; ok {
			res = o
		} else {
			res = breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: -1}
		}
	}
	t := e.targets[chosen]
	force := plan.TryAll || !e.vbuf[plan.Order[plan.Start]].Allowed
	adm, _ := t.Acquire(ctx, e.st, l.At, force)
	eadm, eheld, _ := e.fd.acquire(l.Replica, t.Route, l.At, force)
	fp, hasFP := judge.ParseLogged(l.FP)
	e.seq++
	if e.queue.Len() >= maxInFlight {
		// R-R6: more requests in flight at once than replay holds (lines
		// that all start at one time, or last for days): the one that ends
		// first is recorded now, at its own end, before requests that
		// start earlier are decided. Counted; before, the queue held every
		// one (1 M lines of one start time: about 1 GB).
		e.flushOne()
		e.rep.EarlyOutcomes++
	}
	heap.Push(&e.queue, outcome{at: l.At + max(l.DurationMs, 0)*1e6, seq: e.seq, t: t, adm: adm, res: res, rr: rr, estimated: estimated,
		route: chosen, replica: l.Replica, fp: fp, hasFP: hasFP, again: l.Again, eadm: eadm, eheld: eheld})
	e.tally(l, chosen, rr, res, liveErr, estimated)
}

// tally counts what the request cost on the route the config chose, and
// whether the client would have seen an error, against what it saw.
func (e *engine) tally(l *Line, chosen *routes.Route, rr *RouteReport, res breaker.Result, liveErr, estimated bool) {
	cost := float64(l.Tokens) * chosen.CostPerMtok / 1e6
	rr.Cost += cost
	if estimated {
		rr.CostEstimated += cost
	}
	candErr := clientError(res)
	if candErr {
		e.rep.ClientErrors++
		if estimated {
			e.rep.ClientErrorsEstimated++
		}
	}
	switch {
	case liveErr && !candErr:
		e.rep.Avoided++
	case !liveErr && candErr:
		e.rep.Added++
	}
}

// finish closes the report: breakers still open at the end count their
// time up to the last event.
func (e *engine) finish() {
	for _, rr := range e.rep.Routes {
		rr.bands(float64(e.now) / 1e9)
		if rr.openedAt != 0 {
			rr.OpenSec += float64(e.now-rr.openedAt) / 1e9
			rr.openedAt = 0
		}
	}
	sort.SliceStable(e.rep.Routes, func(i, j int) bool {
		a, b := e.rep.Routes[i], e.rep.Routes[j]
		if a.Gateway != b.Gateway {
			return a.Gateway < b.Gateway
		}
		return a.Model < b.Model
	})
}

// install puts rt's breakers in the store, as the processor does.
func (e *engine) install() {
	var specs []breaker.Spec
	for _, id := range e.rt.GatewayIDs {
		g := e.rt.Gateways[id]
		for _, r := range g.RouteList {
			specs = append(specs, breaker.Spec{ID: breaker.RouteID(id, r.Key), Policy: r.Policy})
			t := &breaker.Target{Route: breaker.KeyOf(breaker.RouteID(id, r.Key))}
			if r.Fleet != nil {
				t.Fleet, t.HasFleet = breaker.KeyOf(breaker.FleetID(r.Fleet.Name)), true
			}
			e.targets[r] = t
		}
	}
	for _, name := range e.rt.FleetNames {
		specs = append(specs, breaker.Spec{ID: breaker.FleetID(name), Policy: e.rt.Fleets[name].Policy})
	}
	_, _, _ = e.st.Install(context.Background(), 0, specs)
	e.fd = newDomains(e, specs)
}

func (e *engine) event(ev breaker.Event) {
	if ev.ID.Scope != breaker.ScopeGateway {
		return
	}
	rr := e.rep.route(ev.ID.Gateway, "", ev.ID.Route)
	rr.Transitions = append(rr.Transitions, Transition{At: float64(ev.At) / 1e9, Change: ev.Transition(), Reason: ev.Reason, Origin: breaker.TransitionOrigin(ev.Reason)})
	switch {
	case ev.To == breaker.Open && ev.From == breaker.Closed:
		rr.Opens++
		rr.openedAt = ev.At
	case ev.To == breaker.Open:
		rr.Opens++
		if rr.openedAt == 0 {
			rr.openedAt = ev.At
		}
	case ev.From == breaker.Open && rr.openedAt != 0:
		rr.OpenSec += float64(ev.At-rr.openedAt) / 1e9
		rr.openedAt = 0
	}
}

// passedOver reports whether route is among the candidates idx names.
func passedOver(idx []int, cands []*routes.Route, route *routes.Route) bool {
	for _, i := range idx {
		if cands[i] == route {
			return true
		}
	}
	return false
}

// liveRoute is the candidate that served the line live: the route fusebox
// named, else the one whose cluster it went to.
func liveRoute(cands []*routes.Route, l *Line) *routes.Route {
	for _, c := range cands {
		if l.Route != "" && c.Key == l.Route {
			return c
		}
	}
	for _, c := range cands {
		if l.Cluster != "" && c.Cluster == l.Cluster {
			return c
		}
	}
	return nil
}

// resultOf rebuilds what the attempt did from the line, before any policy
// judges it: Envoy's own endings from its flags and details, judged as the
// live channels judge them (judge.JudgeHead, R-AL4: a timeout, a
// connection failure, an overflow, no cluster, an answer a timer cut, a
// client that went away), then the classifier's verdict of a body (the
// reason fusebox logged) and the provider's status. The candidate's
// policy then judges it (a different status list counts it differently).
func resultOf(l *Line) breaker.Result {
	elapsed := l.TTFBMs
	if elapsed == 0 {
		elapsed = l.DurationMs
	}
	flags := judge.NamedFlags(l.Flags)
	r, _ := judge.JudgeHead(judge.Head{Status: l.Code, Flags: flags, HasFlags: true,
		Details: l.Details, HasDetails: l.Details != "", EndOfStream: true})
	r.ElapsedMs, r.Status = elapsed, 0
	switch {
	case r.Kind == breaker.KindConnError || r.Kind == breaker.KindTimeout || r.Kind == breaker.KindNeither:
	case flags&judge.ClientFlags != 0:
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonClientCancel
	case l.Outcome == "neither" && l.Reason != "" && l.Reason != breaker.ReasonRequestFault && l.Reason != breaker.ReasonHeldForQuorum:
		// (A request fault or a held local failure is the candidate's to
		// judge again, from the answer: R-FD5.)
		r.Kind, r.Reason = breaker.KindNeither, l.Reason
	case l.Reason == breaker.ReasonDeadTurn && l.Outcome == "failure":
		r.Kind = breaker.KindDeadTurn
	case l.Code >= 200 && l.Code < 300:
		r.Kind, r.Status = breaker.KindAnswered, l.Code
	default:
		r.Kind, r.Status = breaker.KindStatus, l.Code
	}
	return r
}

func clientError(r breaker.Result) bool {
	switch r.Kind {
	case breaker.KindConnError, breaker.KindTimeout:
		return true
	case breaker.KindStatus:
		return r.Status >= 500 || r.Status == 429 || r.Status == 0
	}
	return false
}
