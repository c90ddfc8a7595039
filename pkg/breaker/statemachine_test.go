package breaker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Every transition from every state (R-S1..R-S5).
func TestTransitionsFromEveryState(t *testing.T) {
	type step func(r *rig)
	setups := map[string]step{
		"closed":      func(r *rig) {},
		"open":        func(r *rig) { r.openNow() },
		"half_open":   func(r *rig) { r.halfOpenNow() },
		"forced_open": func(r *rig) { r.st.ForceOpen(r.b, r.now(), r.p, 0) },
	}
	actions := map[string]step{
		"success":          func(r *rig) { r.ok() },
		"failure":          func(r *rig) { r.fail() },
		"neither":          func(r *rig) { r.neither() },
		"cooldown elapses": func(r *rig) { r.advance(time.Second); r.st.Sweep(r.now()) },
		"force open":       func(r *rig) { r.st.ForceOpen(r.b, r.now(), r.p, 0) },
		"force close":      func(r *rig) { r.st.ForceClose(r.b, r.now(), r.p) },
		"reset":            func(r *rig) { r.st.Reset(r.b, r.now(), r.p) },
	}
	cases := []struct {
		from, action string
		want         State
		lastEvent    string // "" = no event caused by the action
	}{
		{"closed", "success", Closed, ""},
		{"closed", "failure", Closed, ""}, // 1 of 3
		{"closed", "neither", Closed, ""},
		{"closed", "cooldown elapses", Closed, ""},
		{"closed", "force open", Open, "closed->open:forced"},
		{"closed", "force close", Closed, ""},
		{"closed", "reset", Closed, ""},
		{"open", "success", Open, ""},
		{"open", "failure", Open, ""},
		{"open", "neither", Open, ""},
		{"open", "cooldown elapses", HalfOpen, "open->half_open:cooldown_elapsed"},
		{"open", "force open", Open, ""},
		{"open", "force close", Closed, "open->closed:force_close"},
		{"open", "reset", Closed, "open->closed:reset"},
		{"half_open", "success", Closed, "half_open->closed:probe_success"},
		{"half_open", "failure", Open, "half_open->open:provider_5xx"},
		{"half_open", "neither", HalfOpen, ""},
		{"half_open", "cooldown elapses", HalfOpen, ""},
		{"half_open", "force open", Open, "half_open->open:forced"},
		{"half_open", "force close", Closed, "half_open->closed:force_close"},
		{"half_open", "reset", Closed, "half_open->closed:reset"},
		{"forced_open", "success", Open, ""},
		{"forced_open", "failure", Open, ""},
		{"forced_open", "neither", Open, ""},
		{"forced_open", "cooldown elapses", Open, ""}, // never probed
		{"forced_open", "force close", Closed, "open->closed:force_close"},
		{"forced_open", "reset", Closed, "open->closed:reset"},
	}
	for _, tc := range cases {
		t.Run(tc.from+"/"+tc.action, func(t *testing.T) {
			r := newRig(t, pol(nil))
			setups[tc.from](r)
			before := len(r.transitions())
			actions[tc.action](r)
			if got := r.state(); got != tc.want {
				t.Fatalf("state %v, want %v", got, tc.want)
			}
			evs := r.transitions()[before:]
			if tc.lastEvent == "" {
				if len(evs) != 0 {
					t.Fatalf("unexpected events %v", evs)
				}
				return
			}
			if len(evs) != 1 || evs[0] != tc.lastEvent {
				t.Fatalf("events %v, want [%s]", evs, tc.lastEvent)
			}
		})
	}
}

// R-W1: the tumbling counter lives exactly 2 × window_sec from the first
// failure and is not extended by later ones.
func TestTumblingWindow(t *testing.T) {
	cases := []struct {
		name   string
		at     []time.Duration // failure times from t0
		opened bool
	}{
		{"three inside the lifetime", []time.Duration{0, 5 * time.Second, 19999 * time.Millisecond}, true},
		{"third at exactly 2×window restarts the count", []time.Duration{0, 10 * time.Second, 20 * time.Second}, false},
		{"not extended by later failures", []time.Duration{0, 19 * time.Second, 20 * time.Second, 21 * time.Second}, false},
		{"new counter after expiry can open", []time.Duration{0, 20 * time.Second, 21 * time.Second, 22 * time.Second}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, pol(nil))
			for _, at := range tc.at {
				r.clk.Set(t0.Add(at))
				r.fail()
			}
			if got := r.state() == Open; got != tc.opened {
				t.Fatalf("opened=%v want %v (%v)", got, tc.opened, r.transitions())
			}
		})
	}
	// The count returns to 0 in one step at expiry.
	r := newRig(t, pol(func(p *Policy) { p.FailureThreshold = 10 }))
	r.fail()
	r.advance(10 * time.Second)
	r.fail()
	if f := r.status().Failures; f != 2 {
		t.Fatalf("failures %d", f)
	}
	r.clk.Set(t0.Add(20*time.Second - 1))
	if f := r.status().Failures; f != 2 {
		t.Fatalf("failures just before expiry %d", f)
	}
	r.clk.Set(t0.Add(20 * time.Second))
	if f := r.status().Failures; f != 0 {
		t.Fatalf("failures at expiry %d", f)
	}
}

// R-W2: failures within the last window_sec.
func TestSlidingWindow(t *testing.T) {
	cases := []struct {
		name   string
		at     []time.Duration
		opened bool
	}{
		{"inside the window", []time.Duration{0, 5 * time.Second, 9500 * time.Millisecond}, true},
		{"first slid out", []time.Duration{0, 5 * time.Second, 11 * time.Second}, false},
		{"long gap then burst", []time.Duration{0, 100 * time.Second, 101 * time.Second, 102 * time.Second}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, pol(func(p *Policy) { p.Window = WindowSliding }))
			for _, at := range tc.at {
				r.clk.Set(t0.Add(at))
				r.fail()
			}
			if got := r.state() == Open; got != tc.opened {
				t.Fatalf("opened=%v want %v", got, tc.opened)
			}
		})
	}
}

// R-T1..R-T4.
func TestTriggers(t *testing.T) {
	cases := []struct {
		name   string
		policy func(*Policy)
		seq    string // f=failure s=success n=neither S=slow success 4=401
		want   State
		reason string
	}{
		{"consecutive: success resets the run", func(p *Policy) { p.FailureThreshold = 100; p.ConsecutiveFailures = 3 }, "ffsff", Closed, ""},
		{"consecutive: neither does not", func(p *Policy) { p.FailureThreshold = 100; p.ConsecutiveFailures = 3 }, "ffnf", Open, ReasonProvider5xx},
		{"consecutive off", func(p *Policy) { p.FailureThreshold = 100 }, "ffffffff", Closed, ""},
		{"rate below minimum", func(p *Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }, "sfs", Closed, ""},
		{"rate reaches percent", func(p *Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }, "sfsf", Open, ReasonFailureRate},
		{"rate below percent", func(p *Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 60; p.MinimumRequests = 4 }, "sfsfs", Closed, ""},
		{"neither not in the rate", func(p *Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }, "fnnnn", Closed, ""},
		{"open on status", func(p *Policy) { p.OpenOnStatusCodes = []int{401} }, "4", Open, ReasonOpenStatus},
		{"401 not listed is neither", nil, "444", Closed, ""},
		{"slow rate", func(p *Policy) { p.SlowCallMs = 1000; p.SlowCallRatePercent = 50; p.MinimumRequests = 2 }, "Ss", Open, ReasonSlowCallRate},
		{"slow rate below minimum", func(p *Policy) { p.SlowCallMs = 1000; p.SlowCallRatePercent = 50; p.MinimumRequests = 3 }, "Ss", Closed, ""},
		{"slow off", func(p *Policy) { p.MinimumRequests = 1 }, "SSSS", Closed, ""},
		{"threshold", nil, "fff", Open, ReasonProvider5xx},
		{"threshold with successes between", nil, "fsfsf", Open, ReasonProvider5xx},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, pol(tc.policy))
			for _, c := range tc.seq {
				switch c {
				case 'f':
					r.fail()
				case 's':
					r.send(Result{Kind: KindAnswered, Status: 200, ElapsedMs: 10})
				case 'S':
					r.send(Result{Kind: KindAnswered, Status: 200, ElapsedMs: 5000})
				case 'n':
					r.neither()
				case '4':
					r.send(Result{Kind: KindStatus, Status: 401})
				}
			}
			if got := r.state(); got != tc.want {
				t.Fatalf("state %v want %v", got, tc.want)
			}
			if tc.reason != "" {
				if s := r.status(); s.Reason != tc.reason {
					t.Fatalf("reason %q want %q", s.Reason, tc.reason)
				}
			}
		})
	}
}

// R-S4: failures are counted only while closed.
func TestFailuresNotCountedWhileOpenOrHalfOpen(t *testing.T) {
	r := newRig(t, pol(func(p *Policy) { p.FailureThreshold = 3; p.HalfOpenMaxProbes = 0 }))
	r.openNow()
	before := r.status()
	r.fail()
	r.fail()
	if s := r.status(); s.Failures != before.Failures || s.WindowFailures != before.WindowFailures {
		t.Fatalf("open counted failures: %+v → %+v", before.Failures, s.Failures)
	}
	r.advance(time.Second)
	if r.state() != HalfOpen {
		t.Fatal("want half_open")
	}
	r.fail()
	s := r.status()
	if s.State != "open" || s.Failures != before.Failures {
		t.Fatalf("half-open failure: %+v", s)
	}
}

// R-S3: probes are bounded; a neither frees its slot; leases time out.
func TestHalfOpenProbes(t *testing.T) {
	r := newRig(t, pol(func(p *Policy) { p.HalfOpenMaxProbes = 2; p.ProbeTimeoutMs = 5000 }))
	r.halfOpenNow()
	a1, ok1 := r.st.Acquire(r.b, r.now(), r.p, false, false)
	_, ok2 := r.st.Acquire(r.b, r.now(), r.p, false, false)
	_, ok3 := r.st.Acquire(r.b, r.now(), r.p, false, false)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("acquires %v %v %v", ok1, ok2, ok3)
	}
	if v := r.b.Peek(r.now(), r.p); v.Allowed || !v.ProbesFull || v.RecoveryAt != r.now()+5e9 {
		t.Fatalf("peek with full slots: %+v", v)
	}
	if s := r.status(); s.ProbesInFlight != 2 {
		t.Fatalf("probes_in_flight %d", s.ProbesInFlight)
	}
	// A neither frees its slot and changes nothing.
	r.st.Record(r.b, r.now(), r.p, a1, Result{Kind: KindNeither, Reason: ReasonClientCancel})
	if r.state() != HalfOpen {
		t.Fatal("neither changed state")
	}
	if _, ok := r.st.Acquire(r.b, r.now(), r.p, false, false); !ok {
		t.Fatal("slot not freed by neither")
	}
	// Shadow mode never takes a slot.
	if adm, ok := r.st.Acquire(r.b, r.now(), r.p, true, false); !ok || adm.Lease != 0 {
		t.Fatalf("shadow acquire %+v %v", adm, ok)
	}
	// Leases expire after probe_timeout_ms.
	r.advance(5 * time.Second)
	if s := r.status(); s.ProbesInFlight != 0 {
		t.Fatalf("leases not expired: %d", s.ProbesInFlight)
	}
	// Zero = admit everything.
	r2 := newRig(t, pol(func(p *Policy) { p.HalfOpenMaxProbes = 0 }))
	r2.halfOpenNow()
	for i := 0; i < 50; i++ {
		if _, ok := r2.st.Acquire(r2.b, r2.now(), r2.p, false, false); !ok {
			t.Fatal("max_probes 0 must admit every request")
		}
	}
}

func TestHalfOpenProbesConcurrent(t *testing.T) {
	for _, max := range []int{1, 3, 7} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			r := newRig(t, pol(func(p *Policy) { p.HalfOpenMaxProbes = max }))
			r.halfOpenNow()
			var got = make(chan bool, 200)
			start := make(chan struct{})
			done := make(chan struct{})
			for i := 0; i < 200; i++ {
				go func() {
					<-start
					_, ok := r.st.Acquire(r.b, r.now(), r.p, false, false)
					got <- ok
					done <- struct{}{}
				}()
			}
			close(start)
			for i := 0; i < 200; i++ {
				<-done
			}
			close(got)
			n := 0
			for ok := range got {
				if ok {
					n++
				}
			}
			if n != max {
				t.Fatalf("admitted %d probes, want %d", n, max)
			}
		})
	}
}

// R-S6: an outcome from an earlier generation changes nothing.
func TestLateOutcomeFromOldGeneration(t *testing.T) {
	r := newRig(t, pol(nil))
	old, _ := r.st.Acquire(r.b, r.now(), r.p, false, false) // a long stream starts
	r.halfOpenNow()
	rec := r.st.Record(r.b, r.now(), r.p, old, Result{Kind: KindAnswered, Status: 200})
	if !rec.Stale {
		t.Fatal("not marked stale")
	}
	if r.state() != HalfOpen {
		t.Fatalf("stale success changed state to %v", r.state())
	}
	// A stale failure does not re-open either.
	r.st.Record(r.b, r.now(), r.p, old, Result{Kind: KindStatus, Status: 500})
	if r.state() != HalfOpen {
		t.Fatal("stale failure re-opened")
	}
	// A closed-state failure from before a force-close does not count after it.
	r2 := newRig(t, pol(func(p *Policy) { p.FailureThreshold = 1 }))
	adm, _ := r2.st.Acquire(r2.b, r2.now(), r2.p, false, false)
	r2.st.ForceClose(r2.b, r2.now(), r2.p)
	r2.st.Record(r2.b, r2.now(), r2.p, adm, Result{Kind: KindStatus, Status: 500})
	if r2.state() != Closed {
		t.Fatal("pre-override failure counted")
	}
}

// Backoff: cooldown × multiplier^(k-1) for the k-th consecutive opening of
// an episode, capped at max_cooldown_ms; closing resets it.
func TestBackoffSequence(t *testing.T) {
	r := newRig(t, pol(func(p *Policy) { p.CooldownMs = 1000; p.BackoffMultiplier = 2; p.MaxCooldownMs = 5000 }))
	r.openNow()
	var got []string
	for i := 0; i < 5; i++ {
		s := r.status()
		got = append(got, fmt.Sprintf("%.0f", (*s.OpenUntil-float64(r.now())/1e9)*1000))
		r.advance(time.Duration(*s.OpenUntil*1e9 - float64(r.now())))
		if r.state() != HalfOpen {
			t.Fatal("not half-open after cooldown")
		}
		r.fail()
	}
	if strings.Join(got, ",") != "1000,2000,4000,5000,5000" {
		t.Fatalf("cooldowns %v", got)
	}
	// Success closes and resets the backoff.
	r.advance(5 * time.Second)
	r.ok()
	r.openNow()
	if s := r.status(); *s.OpenUntil-float64(r.now())/1e9 != 1 {
		t.Fatalf("backoff not reset: %v", *s.OpenUntil-float64(r.now())/1e9)
	}
	// Multiplier 1: constant.
	if cooldownFor(pol(nil), 7) != 1000*1e6 {
		t.Fatal("multiplier 1 must not back off")
	}
}

// opened_at is the episode's start; re-opens set reopened_at and count.
func TestEpisodeTimes(t *testing.T) {
	r := newRig(t, pol(nil))
	r.openNow()
	opened := *r.status().OpenedAt
	if r.status().ReopenedAt != nil || r.status().Reopens != 0 {
		t.Fatal("reopen fields set on first open")
	}
	r.advance(time.Second)
	r.fail() // half-open → open
	s := r.status()
	if *s.OpenedAt != opened || s.ReopenedAt == nil || *s.ReopenedAt != float64(r.now())/1e9 || s.Reopens != 1 {
		t.Fatalf("after reopen: %+v", s)
	}
	r.advance(time.Second)
	r.ok()
	s = r.status()
	if s.OpenedAt != nil || s.Reopens != 0 || s.Notable || s.WindowCalls != 0 {
		t.Fatalf("closing must clear the episode and the metrics: %+v", s)
	}
}

// R-A1: a Retry-After blocks; longer extends, shorter never shortens, capped.
func TestRetryAfterBlock(t *testing.T) {
	ra := func(r *rig, status int, d time.Duration) {
		r.send(Result{Kind: KindStatus, Status: status, RetryAfterUnixNano: r.now() + int64(d)})
	}
	blocked := func(r *rig) float64 {
		s := r.status()
		if s.BlockedUntil == nil {
			return 0
		}
		return *s.BlockedUntil - float64(r.now())/1e9
	}
	cases := []struct {
		name   string
		policy func(*Policy)
		steps  func(r *rig)
		want   float64
	}{
		{"429 blocks", nil, func(r *rig) { ra(r, 429, 30*time.Second) }, 30},
		{"503 blocks", nil, func(r *rig) { ra(r, 503, 30*time.Second) }, 30},
		{"500 does not", nil, func(r *rig) { ra(r, 500, 30*time.Second) }, 0},
		{"shorter never shortens", nil, func(r *rig) { ra(r, 429, 30*time.Second); ra(r, 429, 5*time.Second) }, 30},
		{"longer extends", nil, func(r *rig) { ra(r, 429, 30*time.Second); ra(r, 429, 60*time.Second) }, 60},
		{"capped", func(p *Policy) { p.MaxRetryAfterSec = 45 }, func(r *rig) { ra(r, 429, time.Hour) }, 45},
		{"ignore", func(p *Policy) { p.RetryAfter = RetryAfterIgnore }, func(r *rig) { ra(r, 429, 30*time.Second) }, 0},
		{"in the past", nil, func(r *rig) { ra(r, 429, -time.Second) }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, pol(func(p *Policy) {
				p.FailureThreshold = 100
				if tc.policy != nil {
					tc.policy(p)
				}
			}))
			tc.steps(r)
			if got := blocked(r); got != tc.want {
				t.Fatalf("blocked for %v, want %v", got, tc.want)
			}
			if tc.want > 0 {
				v := r.b.Peek(r.now(), r.p)
				if v.Allowed || !v.Blocked || r.state() != Closed {
					t.Fatalf("block must skip the route independent of state: %+v", v)
				}
				r.advance(time.Duration(tc.want * float64(time.Second)))
				if v := r.b.Peek(r.now(), r.p); !v.Allowed {
					t.Fatalf("still blocked after the deadline: %+v", v)
				}
			}
		})
	}
	// Reset clears a block; force-close keeps it.
	r := newRig(t, pol(nil))
	ra(r, 429, 30*time.Second)
	r.st.ForceClose(r.b, r.now(), r.p)
	if blocked(r) == 0 {
		t.Fatal("force-close cleared the block")
	}
	r.st.Reset(r.b, r.now(), r.p)
	if blocked(r) != 0 {
		t.Fatal("reset kept the block")
	}
}

// R-S5: forced open is never probed; its duration ends in a cleared close.
func TestForceOpen(t *testing.T) {
	r := newRig(t, pol(nil))
	r.fail()
	r.st.ForceOpen(r.b, r.now(), r.p, 10*time.Second)
	v := r.b.Peek(r.now(), r.p)
	if v.Allowed || !v.Forced || v.RecoveryAt != r.now()+10e9 {
		t.Fatalf("forced verdict %+v", v)
	}
	r.advance(5 * time.Second)
	if r.state() != Open {
		t.Fatal("forced open half-opened")
	}
	if adm, ok := r.st.Acquire(r.b, r.now(), r.p, false, false); ok || adm.Lease != 0 {
		t.Fatal("forced open admitted a probe")
	}
	r.advance(5 * time.Second)
	r.st.Sweep(r.now())
	s := r.status()
	if s.State != "closed" || s.Forced || s.Failures != 0 {
		t.Fatalf("after the duration: %+v", s)
	}
	if evs := r.transitions(); evs[len(evs)-1] != "open->closed:force_expired" {
		t.Fatalf("events %v", evs)
	}
	// Without a duration: never recovers.
	r.st.ForceOpen(r.b, r.now(), r.p, 0)
	if v := r.b.Peek(r.now(), r.p); v.RecoveryAt != Never {
		t.Fatalf("recovery %d", v.RecoveryAt)
	}
	r.advance(time.Hour)
	if r.state() != Open {
		t.Fatal("forced open without duration ended")
	}
	// Force-close closes once; it does not pin.
	r.st.ForceClose(r.b, r.now(), r.p)
	r.openNow()
}

// R-S2: a due transition is made by the sweep, once; a read racing the sweep
// makes no duplicate event.
func TestSweepMakesDueTransitionsOnce(t *testing.T) {
	r := newRig(t, pol(nil))
	r.openNow()
	r.advance(time.Second)
	done := make(chan struct{})
	for i := 0; i < 8; i++ {
		go func() {
			r.st.Sweep(r.now())
			r.b.Peek(r.now(), r.p)
			done <- struct{}{}
		}()
	}
	for i := 0; i < 8; i++ {
		<-done
	}
	n := 0
	for _, e := range r.transitions() {
		if strings.HasPrefix(e, "open->half_open") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d open->half_open events: %v", n, r.transitions())
	}
}

func TestTransitionEventFields(t *testing.T) {
	r := newRig(t, pol(nil))
	r.ok()
	r.openNow()
	r.mu.Lock()
	e := r.evs[0]
	r.mu.Unlock()
	if e.Transition() != "closed->open" || e.Reason != ReasonProvider5xx || e.Failures != 3 || e.Threshold != 3 ||
		e.PolicyVersion != r.p.Version || e.OpenUntil != r.now()+1e9 || e.WindowCalls != 4 || e.WindowFailures != 3 ||
		e.ID.Gateway != "gw" || e.Provider != "openai" || e.ID.Scope != ScopeGateway {
		t.Fatalf("event %+v", e)
	}
}

// R-P9: a policy change keeps state; new thresholds apply from the next
// outcome.
func TestPolicyChangeKeepsState(t *testing.T) {
	r := newRig(t, pol(func(p *Policy) { p.FailureThreshold = 5 }))
	r.fail()
	r.fail()
	r.p = pol(func(p *Policy) { p.FailureThreshold = 3 })
	if s := r.status(); s.Failures != 2 || s.PolicyVersion != r.p.Version {
		t.Fatalf("state lost on policy change: %+v", s)
	}
	r.fail()
	if r.state() != Open {
		t.Fatal("new threshold not applied")
	}
	// A window resize keeps the buckets that still fit.
	r2 := newRig(t, pol(func(p *Policy) { p.Window = WindowSliding; p.FailureThreshold = 10; p.WindowSec = 60 }))
	r2.fail()
	r2.advance(20 * time.Second)
	r2.fail()
	r2.p = pol(func(p *Policy) { p.Window = WindowSliding; p.FailureThreshold = 10; p.WindowSec = 10 })
	if f := r2.status().Failures; f != 1 {
		t.Fatalf("after shrinking the window: %d failures", f)
	}
}

// Fleets judge the same attempt with their own policy.
func TestFleetJudgesWithItsOwnPolicy(t *testing.T) {
	clk := NewFakeClock(t0)
	st := NewMemory(nil)
	routeP := pol(func(p *Policy) { p.FailureThreshold = 2 })
	fleetP := pol(func(p *Policy) { p.FailureThreshold = 2; p.FailureStatusCodes = []int{429, 500} })
	fleetP.Finish()
	tg := Target{
		Route: st.Breaker(RouteID("gw", "self:a:m"), routeP), RoutePolicy: routeP,
		Fleet: st.Breaker(FleetID("gpu"), fleetP), FleetPolicy: fleetP,
	}
	other := Target{
		Route: st.Breaker(RouteID("gw2", "self:b:m"), routeP), RoutePolicy: routeP,
		Fleet: st.Breaker(FleetID("gpu"), fleetP), FleetPolicy: fleetP,
	}
	now := clk.Now().UnixNano()
	for i := 0; i < 2; i++ {
		a, ok := tg.Acquire(st, now, false, false)
		if !ok {
			t.Fatal("refused")
		}
		route, fleet, used := tg.Record(st, now, a, Result{Kind: KindStatus, Status: 429})
		if !used || route.Outcome.Class != Neither || fleet.Outcome.Class != Failure {
			t.Fatalf("429: route %v fleet %v", route.Outcome, fleet.Outcome)
		}
	}
	if v := tg.Route.Peek(now, routeP); !v.Allowed {
		t.Fatal("route breaker opened on a 429 it does not count")
	}
	// The fleet is open for every gateway's routes in it.
	if v := other.Peek(now); v.Allowed || v.State != Open {
		t.Fatalf("fleet open must block other gateways' routes: %+v", v)
	}
	if tg.Fleet.ID().Scope != ScopeGlobal || tg.Fleet.Status(now, fleetP).Scope != ScopeGlobal {
		t.Fatal("fleet scope")
	}
}

func TestJudge(t *testing.T) {
	p := pol(func(p *Policy) {
		p.FailureStatusCodes = []int{500, 503, 429, 408}
		p.OpenOnStatusCodes = []int{401}
		p.SlowCallMs = 100
	})
	cases := []struct {
		r      Result
		class  Class
		reason string
		slow   bool
	}{
		{Result{Kind: KindStatus, Status: 500}, Failure, ReasonProvider5xx, false},
		{Result{Kind: KindStatus, Status: 429}, Failure, ReasonProvider429, false},
		{Result{Kind: KindStatus, Status: 408}, Failure, ReasonProviderStatus, false},
		{Result{Kind: KindStatus, Status: 502}, Neither, ReasonStatusNotListed, false},
		{Result{Kind: KindStatus, Status: 400}, Neither, ReasonClientError, false},
		{Result{Kind: KindStatus, Status: 401}, Failure, ReasonOpenStatus, false},
		{Result{Kind: KindConnError, Status: 503}, Failure, ReasonConnection, false},
		{Result{Kind: KindTimeout, Status: 504}, Failure, ReasonTimeout, false},
		{Result{Kind: KindDeadTurn, Status: 200}, Failure, ReasonDeadTurn, false},
		{Result{Kind: KindAnswered, Status: 200, ElapsedMs: 150}, Success, ReasonSuccess, true},
		{Result{Kind: KindNeither, Reason: ReasonEnvoyOverflow, ElapsedMs: 500}, Neither, ReasonEnvoyOverflow, false},
	}
	for _, tc := range cases {
		o := p.Judge(tc.r)
		if o.Class != tc.class || o.Reason != tc.reason || o.Slow != tc.slow {
			t.Errorf("%+v → %+v, want %v %s slow=%v", tc.r, o, tc.class, tc.reason, tc.slow)
		}
	}
	// [] = no status ever counts, but connection errors still do.
	empty := pol(func(p *Policy) { p.FailureStatusCodes = []int{} })
	if empty.Judge(Result{Kind: KindStatus, Status: 500}).Class != Neither || empty.Judge(Result{Kind: KindConnError}).Class != Failure {
		t.Fatal("empty list")
	}
}

// RunSweeper makes a due transition without any read of the breaker.
func TestRunSweeper(t *testing.T) {
	r := newRig(t, pol(nil))
	r.openNow()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go RunSweeper(ctx, r.st, r.clk, time.Millisecond)
	r.advance(time.Second) // the cooldown, on the fake clock
	deadline := time.Now().Add(5 * time.Second)
	for {
		evs := r.transitions()
		if evs[len(evs)-1] == "open->half_open:cooldown_elapsed" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper made no transition: %v", evs)
		}
		time.Sleep(time.Millisecond)
	}
}
