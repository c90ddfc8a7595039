package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Factory returns an empty store whose transitions go to onEvent. The suite
// calls it once per test case.
type Factory func(t *testing.T, onEvent func(breaker.Event)) breaker.Store

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var ctx = context.Background()

func pol(mod func(*breaker.Policy)) *breaker.Policy {
	p := breaker.DefaultPolicy()
	p.Enabled = true
	p.FailureThreshold = 3
	p.WindowSec = 10
	p.CooldownMs = 1000
	if mod != nil {
		mod(&p)
	}
	return p.Finish()
}

var rigID = breaker.RouteID("gw", "openai:us:m")

// rig drives one breaker of a store with a fake clock and records its events.
type rig struct {
	t   *testing.T
	clk *breaker.FakeClock
	st  breaker.Store
	k   breaker.Key
	p   *breaker.Policy
	mu  sync.Mutex
	evs []breaker.Event
}

func newRig(t *testing.T, f Factory, p *breaker.Policy) *rig {
	t.Helper()
	r := &rig{t: t, clk: breaker.NewFakeClock(t0)}
	r.st = f(t, func(e breaker.Event) { r.mu.Lock(); r.evs = append(r.evs, e); r.mu.Unlock() })
	r.install(p)
	return r
}

// newCaseRig is a rig on a policy that never trips on failures (threshold
// 100), edited by mod (nil: none): a table case's.
func newCaseRig(t *testing.T, f Factory, mod func(*breaker.Policy)) *rig {
	t.Helper()
	return newRig(t, f, pol(func(p *breaker.Policy) {
		p.FailureThreshold = 100
		if mod != nil {
			mod(p)
		}
	}))
}

// install puts p in force for the rig's breaker, as a config reload does.
func (r *rig) install(p *breaker.Policy) {
	r.t.Helper()
	keys, _, err := r.st.Install(ctx, r.now(), []breaker.Spec{{ID: rigID, Policy: p}})
	if err != nil {
		r.t.Fatalf("install: %v", err)
	}
	r.k, r.p = keys[0], p
}

func (r *rig) now() int64 { return r.clk.Now().UnixNano() }

func (r *rig) advance(d time.Duration) { r.clk.Advance(d) }

func (r *rig) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("store: %v", err)
	}
}

func (r *rig) acquire(force bool) (breaker.Admission, bool) {
	r.t.Helper()
	adm, ok, err := r.st.Acquire(ctx, r.k, r.now(), force)
	r.must(err)
	return adm, ok
}

func (r *rig) record(adm breaker.Admission, res breaker.Result) breaker.Recorded {
	r.t.Helper()
	rec, err := r.st.Record(ctx, r.k, r.now(), adm, res)
	r.must(err)
	return rec
}

func (r *rig) peek() breaker.Verdict {
	r.t.Helper()
	return r.st.Peek(ctx, r.k, r.now())
}

func (r *rig) forceOpen(d time.Duration) { r.t.Helper(); r.must(r.st.ForceOpen(ctx, r.k, r.now(), d)) }
func (r *rig) forceClose()               { r.t.Helper(); r.must(r.st.ForceClose(ctx, r.k, r.now())) }
func (r *rig) reset()                    { r.t.Helper(); r.must(r.st.Reset(ctx, r.k, r.now())) }
func (r *rig) sweep()                    { r.t.Helper(); r.must(r.st.Sweep(ctx, r.now())) }

// send admits one request (forced, as try_all would) and records res.
func (r *rig) send(res breaker.Result) breaker.Recorded {
	r.t.Helper()
	adm, ok := r.acquire(true)
	if !ok {
		r.t.Fatalf("forced acquire refused")
	}
	return r.record(adm, res)
}

func (r *rig) fail() { r.send(breaker.Result{Kind: breaker.KindStatus, Status: 503}) }
func (r *rig) ok()   { r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200}) }
func (r *rig) neither() {
	r.send(breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel})
}

func (r *rig) status() breaker.Status {
	r.t.Helper()
	s, err := r.st.Status(ctx, r.k, r.now())
	r.must(err)
	return s
}

func (r *rig) state() breaker.State {
	r.t.Helper()
	switch r.status().State {
	case "open":
		return breaker.Open
	case "half_open":
		return breaker.HalfOpen
	}
	return breaker.Closed
}

func (r *rig) transitions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.evs))
	for _, e := range r.evs {
		if e.Saturation == "" {
			out = append(out, e.Transition()+":"+e.Reason)
		}
	}
	return out
}

func (r *rig) openNow() {
	r.t.Helper()
	for i := 0; i < r.p.FailureThreshold; i++ {
		r.fail()
	}
	if r.state() != breaker.Open {
		r.t.Fatalf("setup: want open, got %v", r.state())
	}
}

func (r *rig) halfOpenNow() {
	r.t.Helper()
	r.openNow()
	r.advance(time.Duration(r.p.CooldownMs) * time.Millisecond)
	if r.state() != breaker.HalfOpen {
		r.t.Fatalf("setup: want half_open, got %v", r.state())
	}
}

// saturations are the saturation events seen, in order.
func (r *rig) saturations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.evs {
		if e.Saturation != "" {
			out = append(out, e.Saturation)
		}
	}
	return out
}
