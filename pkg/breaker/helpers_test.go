package breaker

import (
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func pol(mod func(*Policy)) *Policy {
	p := DefaultPolicy()
	p.Enabled = true
	p.FailureThreshold = 3
	p.WindowSec = 10
	p.CooldownMs = 1000
	if mod != nil {
		mod(&p)
	}
	return p.Finish()
}

// rig drives one breaker with a fake clock and records its events.
type rig struct {
	t   *testing.T
	clk *FakeClock
	st  *Memory
	b   *Breaker
	p   *Policy
	mu  sync.Mutex
	evs []Event
}

func newRig(t *testing.T, p *Policy) *rig {
	r := &rig{t: t, clk: NewFakeClock(t0), p: p}
	r.st = NewMemory(func(e Event) { r.mu.Lock(); r.evs = append(r.evs, e); r.mu.Unlock() })
	r.b = r.st.Breaker(RouteID("gw", "openai:us:m"), p)
	return r
}

func (r *rig) now() int64 { return r.clk.Now().UnixNano() }

func (r *rig) advance(d time.Duration) { r.clk.Advance(d) }

// send admits one request and records res for it.
func (r *rig) send(res Result) Recorded {
	r.t.Helper()
	adm, ok := r.st.Acquire(r.b, r.now(), r.p, false, true)
	if !ok {
		r.t.Fatalf("forced acquire refused")
	}
	return r.st.Record(r.b, r.now(), r.p, adm, res)
}

func (r *rig) fail()    { r.send(Result{Kind: KindStatus, Status: 503}) }
func (r *rig) ok()      { r.send(Result{Kind: KindAnswered, Status: 200}) }
func (r *rig) neither() { r.send(Result{Kind: KindNeither, Reason: ReasonClientCancel}) }

func (r *rig) state() State { return State(r.b.Status(r.now(), r.p).stateNum()) }

func (r *rig) status() Status { return r.b.Status(r.now(), r.p) }

func (r *rig) transitions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.evs))
	for i, e := range r.evs {
		out[i] = e.Transition() + ":" + e.Reason
	}
	return out
}

func (r *rig) openNow() {
	r.t.Helper()
	for i := 0; i < r.p.FailureThreshold; i++ {
		r.fail()
	}
	if r.state() != Open {
		r.t.Fatalf("setup: want open, got %v", r.state())
	}
}

func (r *rig) halfOpenNow() {
	r.t.Helper()
	r.openNow()
	r.advance(time.Duration(r.p.CooldownMs) * time.Millisecond)
	if r.state() != HalfOpen {
		r.t.Fatalf("setup: want half_open, got %v", r.state())
	}
}

func (s Status) stateNum() int {
	switch s.State {
	case "open":
		return 1
	case "half_open":
		return 2
	}
	return 0
}
