package replay

import (
	"context"
	"sort"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/processor"
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

// maxMarks bounds the failures kept per route for the timeline.
const maxMarks = 2000

func (rr *RouteReport) bands(end float64) {
	for i, t := range rr.Transitions {
		_, to, _ := strings.Cut(t.Change, "->")
		if to == "closed" {
			continue
		}
		until := end
		if i+1 < len(rr.Transitions) {
			until = rr.Transitions[i+1].At
		}
		rr.Bands = append(rr.Bands, Band{From: t.At, To: until, State: to})
	}
}

// Transition is one state change in the replay.
type Transition struct {
	At     float64 `json:"at"`
	Change string  `json:"change"`
	Reason string  `json:"reason"`
}

// Report is one replay's result.
type Report struct {
	Lines, Malformed, Skipped int // Skipped: a gateway or model the config lacks
	// ClientErrors are the requests that would have failed at the client
	// (an error status, or fail_fast); Estimated those of them whose
	// outcome was estimated.
	ClientErrors, ClientErrorsEstimated int
	// Live is what happened: the client errors the log shows, and the cost
	// of the tokens it holds on the routes that served them.
	LiveClientErrors int     `json:"live_client_errors"`
	LiveCost         float64 `json:"live_cost"`
	// Avoided and Added compare the config with what happened, request by
	// request (estimated where the config changed the route).
	Avoided, Added int
	Routes         []*RouteReport
	byKey          map[string]*RouteReport
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
	observed map[string]breaker.Result
	now      int64
}

// Run replays log under rt. The clock is the lines' own times.
func Run(rt *routes.Runtime, log *Log) *Report {
	e := &engine{rt: rt, targets: map[*routes.Route]*breaker.Target{}, observed: map[string]breaker.Result{},
		rep: &Report{Lines: len(log.Lines), Malformed: log.Malformed, byKey: map[string]*RouteReport{}}}
	e.st = breaker.NewMemory(e.event)
	e.install()
	ctx := context.Background()
	var vbuf []breaker.Verdict
	var obuf, sbuf []int
	for i := range log.Lines {
		l := &log.Lines[i]
		e.now = l.At
		gwID := l.Gateway
		if gwID == "" {
			gwID = "default"
		}
		gw, ok := rt.Gateway(gwID)
		if !ok {
			e.rep.Skipped++
			continue
		}
		m, ok := gw.Model(l.Model)
		if !ok {
			e.rep.Skipped++
			continue
		}
		cands := m.Candidates(nil)
		live := liveRoute(cands, l)
		res := resultOf(l)
		liveErr := clientError(res)
		if liveErr {
			e.rep.LiveClientErrors++
		}
		if live != nil {
			e.observed[gwID+"|"+live.Key] = res
			e.rep.LiveCost += float64(l.Tokens) * live.CostPerMtok / 1e6
		}
		vbuf = vbuf[:0]
		for _, c := range cands {
			vbuf = append(vbuf, e.targets[c].Peek(ctx, e.st, l.At).Verdict)
		}
		sel := processor.Select(l.At, vbuf, m.Policy.MaxEjectionPercent, m.Policy.WhenAllOpen, obuf[:0], sbuf[:0])
		obuf, sbuf = sel.Order, sel.Skipped
		if sel.FailFast || len(sel.Order) == 0 {
			e.rep.ClientErrors++
			if !liveErr {
				e.rep.Added++
			}
			if live != nil {
				e.rep.route(gwID, m.Name, live.Key).Rerouted++
			}
			continue
		}
		// R-D8: a route on its recovery ramp is passed over as the live
		// decision would have been, by the same draw of the decision id.
		at := 0
		for at < len(sel.Order)-1 && !sel.TryAll {
			r := vbuf[sel.Order[at]].RampPermille
			if r == 0 || processor.RampDraw(l.Decision, cands[sel.Order[at]].Key) < r {
				break
			}
			at++
		}
		chosen := cands[sel.Order[at]]
		rr := e.rep.route(gwID, m.Name, chosen.Key)
		rr.Served++
		estimated := chosen != live
		if estimated {
			if live != nil {
				e.rep.route(gwID, m.Name, live.Key).Rerouted++
			}
			if o, ok := e.observed[gwID+"|"+chosen.Key]; ok {
				res = o
			} else {
				res = breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: -1}
			}
		}
		t := e.targets[chosen]
		adm, _ := t.Acquire(ctx, e.st, l.At, sel.TryAll)
		route, _, _ := t.Record(ctx, e.st, l.At, adm, res)
		if route.Applied && route.Outcome.Class == breaker.Failure {
			rr.MetFailing++
			if len(rr.Failures) < maxMarks {
				rr.Failures = append(rr.Failures, float64(l.At)/1e9)
			}
			if estimated {
				rr.MetFailingEstimated++
			}
		}
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
	// Breakers still open at the end count their time up to the last line.
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
	return e.rep
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
}

func (e *engine) event(ev breaker.Event) {
	if ev.ID.Scope != breaker.ScopeGateway {
		return
	}
	rr := e.rep.route(ev.ID.Gateway, "", ev.ID.Route)
	rr.Transitions = append(rr.Transitions, Transition{At: float64(ev.At) / 1e9, Change: ev.Transition(), Reason: ev.Reason})
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
// judges it: Envoy's own endings from its flags, the provider's status,
// and the classifier's verdict of a body (the reason fusebox logged). The
// candidate's policy then judges it (a different status list counts it
// differently).
func resultOf(l *Line) breaker.Result {
	elapsed := l.TTFBMs
	if elapsed == 0 {
		elapsed = l.DurationMs
	}
	r := breaker.Result{ElapsedMs: elapsed}
	switch {
	case strings.Contains(l.Flags, "UT"):
		r.Kind = breaker.KindTimeout
	case hasAny(l.Flags, "UF", "UC", "UR", "LR", "UPE", "UH"):
		r.Kind = breaker.KindConnError
	case strings.Contains(l.Flags, "UO"):
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonEnvoyOverflow
	case strings.Contains(l.Flags, "DC"):
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonClientCancel
	case l.Outcome == "neither" && l.Reason != "":
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

func hasAny(flags string, names ...string) bool {
	for _, f := range strings.Split(flags, ",") {
		for _, n := range names {
			if f == n {
				return true
			}
		}
	}
	return false
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
