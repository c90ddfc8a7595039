package replay

import (
	"context"
	"strconv"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// Whose failure it is, replayed (SPEC R-FD5). The line names the replica
// that decided the request and the request's keyed fingerprint, and says
// whether it was sent again (fusebox.replica, fusebox.fp, fusebox.again);
// replay then judges as live does:
//   - a locally originated failure (no answer came) counts for the route
//     once local_origin_quorum replicas (at most those alive: that wrote
//     a line in the last 15 s, as a replica's beat lives in the store) each
//     had one in the window; until then it is held, and trips the
//     replica's own view of its egress, whose open routes that replica's
//     requests alone (scope replica);
//   - an upstream failure of a fingerprint that failed before with the
//     same answer, sent again, while the routes answer others, is the
//     request's (request_fault): it counts for no route, with the very
//     ledger the live roles keep (judge.FaultLedger).
//
// A line without a replica is one replica's (an older fusebox: nothing is
// held); without a fingerprint, no request fault is judged.

// replicaAlive is how long a replica's line counts it alive (redisstore's
// aliveFor: three beats of 5 s).
const replicaAlive = int64(15 * time.Second)

// maxViews bounds the replicas replay keeps an egress view for; the lines
// of replicas past it are judged without one (their failures are held
// all the same).
const maxViews = 256

type domains struct {
	e      *engine
	ledger *judge.FaultLedger
	// seen: each replica's latest line start; local: each route's
	// replicas' latest local failure.
	seen  map[string]int64
	local map[breaker.ID]map[string]int64
	views map[string]*egressView
	specs []breaker.Spec
}

// egressView is one replica's own view of its egress, as live keeps it
// (redisstore/egress.go): a memory store fed its held local failures and
// its successes.
type egressView struct {
	mem       *breaker.Memory
	notClosed map[breaker.ID]bool
}

func newDomains(e *engine, specs []breaker.Spec) *domains {
	// Replay has no fleet key: fingerprints come from the line, already
	// keyed; the ledger's own key is never used.
	return &domains{e: e, ledger: judge.NewFaultLedger(nil), seen: map[string]int64{},
		local: map[breaker.ID]map[string]int64{}, views: map[string]*egressView{}, specs: specs}
}

// saw counts replica alive at at.
func (d *domains) saw(replica string, at int64) {
	if replica == "" {
		return
	}
	if _, ok := d.seen[replica]; !ok && len(d.seen) >= 4*maxViews {
		for r, t := range d.seen {
			if t+replicaAlive <= at {
				delete(d.seen, r)
			}
		}
	}
	d.seen[replica] = at
}

// alive is how many replicas wrote a line in the last replicaAlive (at
// least one).
func (d *domains) alive(at int64) int {
	n := 0
	for _, t := range d.seen {
		if t+replicaAlive > at {
			n++
		}
	}
	return max(n, 1)
}

// view is replica's egress view, made on first need (nil past maxViews).
func (d *domains) view(replica string, make bool) *egressView {
	if replica == "" {
		return nil
	}
	if v, ok := d.views[replica]; ok || !make || len(d.views) >= maxViews {
		return v
	}
	v := &egressView{notClosed: map[breaker.ID]bool{}}
	v.mem = breaker.NewMemory(func(ev breaker.Event) { d.replicaEvent(replica, v, ev) })
	_, _, _ = v.mem.Install(context.Background(), 0, d.specs)
	d.views[replica] = v
	return v
}

// peek is the verdict of route k for a request of replica: the fleet's,
// unless the replica's egress view refuses the route.
func (d *domains) peek(replica string, k breaker.Key, at int64, v breaker.Verdict) breaker.Verdict {
	ev := d.view(replica, false)
	if ev == nil || !v.Allowed || !ev.notClosed[k.ID()] {
		return v
	}
	if own := ev.mem.Peek(context.Background(), k, at); !own.Allowed || own.ProbesFull {
		own.ReplicaScoped = true
		return own
	}
	return v
}

// acquire takes the egress view's probe slot for a request of replica, when
// that view is not closed; ok false: refused there.
func (d *domains) acquire(replica string, k breaker.Key, at int64, force bool) (adm breaker.Admission, held, ok bool) {
	ev := d.view(replica, false)
	if ev == nil || !ev.notClosed[k.ID()] {
		return breaker.Admission{}, false, true
	}
	adm, ok, _ = ev.mem.Acquire(context.Background(), k, at, force)
	return adm, ok, ok || force
}

// judge is R-FD2 and R-FD4 on one outcome o of route r, before the fleet
// records it: the result the fleet records (a held local failure and a
// request fault are neithers), counted on rr.
func (d *domains) judge(o *outcome, r *routes.Route, res breaker.Result) breaker.Result {
	p := r.Policy
	out := p.Judge(res)
	k := o.t.Route
	if out.Class != breaker.Failure {
		if out.Class == breaker.Success {
			if ev := d.view(o.replica, false); ev != nil && (ev.notClosed[k.ID()] || o.eheld) {
				_, _ = ev.mem.Record(context.Background(), k, o.at, d.eadm(ev, o, k), res)
			}
		} else if ev := d.view(o.replica, false); ev != nil && o.eheld {
			_ = ev.mem.Release(context.Background(), k, o.eadm)
		}
		return res
	}
	if out.Origin() == breaker.OriginLocal {
		o.rr.LocalFailures++
		return d.quorum(o, k, p, res)
	}
	o.rr.UpstreamFailures++
	if ev := d.view(o.replica, false); ev != nil && o.eheld {
		_ = ev.mem.Release(context.Background(), k, o.eadm)
	}
	if !o.hasFP || p.RequestFaultTTLSec <= 0 {
		return res
	}
	sig := out.Reason
	if res.Status != 0 {
		sig = strconv.Itoa(res.Status)
	}
	ttl := int64(p.RequestFaultTTLSec) * int64(time.Second)
	gw := k.ID().Gateway
	fault, _ := d.ledger.Judge(o.fp, sig, r.Key, o.again, o.at, ttl, func(route string) bool {
		s, err := d.e.st.Status(context.Background(), breaker.KeyOf(breaker.RouteID(gw, route)), o.at)
		return err == nil && judge.AnswersOthers(s)
	})
	if !fault {
		return res
	}
	o.rr.RequestFaults++
	return breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonRequestFault, ElapsedMs: res.ElapsedMs}
}

// quorum holds a local failure of o's replica until local_origin_quorum
// replicas (at most those alive) each had one on k's route in the window,
// as breaker.lua does; a held failure trips the replica's egress view.
func (d *domains) quorum(o *outcome, k breaker.Key, p *breaker.Policy, res breaker.Result) breaker.Result {
	if o.replica == "" || !p.Active() || p.LocalOriginQuorum <= 1 {
		return res
	}
	alive := d.alive(o.at)
	seen := d.local[k.ID()]
	if seen == nil {
		seen = map[string]int64{}
		d.local[k.ID()] = seen
	}
	if seen[o.replica] < o.at {
		seen[o.replica] = o.at
	}
	span := int64(p.WindowSec) * int64(time.Second)
	for r, at := range seen {
		if at+span <= o.at {
			delete(seen, r)
		}
	}
	if alive <= 1 || len(seen) >= min(p.LocalOriginQuorum, alive) {
		if ev := d.view(o.replica, false); ev != nil && o.eheld {
			_ = ev.mem.Release(context.Background(), k, o.eadm)
		}
		return res
	}
	o.rr.HeldForQuorum++
	if ev := d.view(o.replica, true); ev != nil {
		_, _ = ev.mem.Record(context.Background(), k, o.at, d.eadm(ev, o, k), res)
	}
	return breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonHeldForQuorum, ElapsedMs: res.ElapsedMs}
}

// eadm is the admission an outcome records with on ev: its probe's, or
// the breaker's current generation.
func (d *domains) eadm(ev *egressView, o *outcome, k breaker.Key) breaker.Admission {
	if o.eheld {
		return o.eadm
	}
	return breaker.Admission{Gen: breaker.CurrentGen(ev.mem, k)}
}

// replicaEvent is a transition of one replica's egress view: listed with
// the route's transitions, scope replica, and counted apart from the
// fleet's opens.
func (d *domains) replicaEvent(replica string, ev *egressView, e breaker.Event) {
	if e.Saturation != "" || e.ID.Scope != breaker.ScopeGateway {
		return
	}
	if e.To == breaker.Closed {
		delete(ev.notClosed, e.ID)
	} else {
		ev.notClosed[e.ID] = true
	}
	rr := d.e.rep.route(e.ID.Gateway, "", e.ID.Route)
	rr.Transitions = append(rr.Transitions, Transition{At: float64(e.At) / 1e9, Change: e.Transition(), Reason: e.Reason,
		Origin: breaker.TransitionOrigin(e.Reason), Replica: replica})
	if e.To == breaker.Open {
		rr.ReplicaOpens++
	}
}
