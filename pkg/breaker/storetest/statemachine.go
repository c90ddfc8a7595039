package storetest

import (
	"fmt"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"strings"
	"testing"
	"time"
)

// Every transition from every state (R-S1..R-S5).
func testTransitionsFromEveryState(t *testing.T, f Factory) {
	type step func(r *rig)
	setups := map[string]step{
		"closed":      func(r *rig) {},
		"open":        func(r *rig) { r.openNow() },
		"half_open":   func(r *rig) { r.halfOpenNow() },
		"forced_open": func(r *rig) { r.forceOpen(0) },
	}
	actions := map[string]step{
		"success":          func(r *rig) { r.ok() },
		"failure":          func(r *rig) { r.fail() },
		"neither":          func(r *rig) { r.neither() },
		"cooldown elapses": func(r *rig) { r.advance(time.Second); r.sweep() },
		"force open":       func(r *rig) { r.forceOpen(0) },
		"force close":      func(r *rig) { r.forceClose() },
		"reset":            func(r *rig) { r.reset() },
	}
	cases := []struct {
		from, action string
		want         breaker.State
		lastEvent    string // "" = no event caused by the action
	}{
		{"closed", "success", breaker.Closed, ""},
		{"closed", "failure", breaker.Closed, ""}, // 1 of 3
		{"closed", "neither", breaker.Closed, ""},
		{"closed", "cooldown elapses", breaker.Closed, ""},
		{"closed", "force open", breaker.Open, "closed->open:forced"},
		{"closed", "force close", breaker.Closed, ""},
		{"closed", "reset", breaker.Closed, ""},
		{"open", "success", breaker.Open, ""},
		{"open", "failure", breaker.Open, ""},
		{"open", "neither", breaker.Open, ""},
		{"open", "cooldown elapses", breaker.HalfOpen, "open->half_open:cooldown_elapsed"},
		{"open", "force open", breaker.Open, ""},
		{"open", "force close", breaker.Closed, "open->closed:force_close"},
		{"open", "reset", breaker.Closed, "open->closed:reset"},
		{"half_open", "success", breaker.Closed, "half_open->closed:probe_success"},
		{"half_open", "failure", breaker.Open, "half_open->open:provider_5xx"},
		{"half_open", "neither", breaker.HalfOpen, ""},
		{"half_open", "cooldown elapses", breaker.HalfOpen, ""},
		{"half_open", "force open", breaker.Open, "half_open->open:forced"},
		{"half_open", "force close", breaker.Closed, "half_open->closed:force_close"},
		{"half_open", "reset", breaker.Closed, "half_open->closed:reset"},
		{"forced_open", "success", breaker.Open, ""},
		{"forced_open", "failure", breaker.Open, ""},
		{"forced_open", "neither", breaker.Open, ""},
		{"forced_open", "cooldown elapses", breaker.Open, ""}, // never probed
		{"forced_open", "force close", breaker.Closed, "open->closed:force_close"},
		{"forced_open", "reset", breaker.Closed, "open->closed:reset"},
	}
	for _, tc := range cases {
		t.Run(tc.from+"/"+tc.action, func(t *testing.T) {
			r := newRig(t, f, pol(nil))
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
func testTumblingWindow(t *testing.T, f Factory) {
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
			r := newRig(t, f, pol(nil))
			for _, at := range tc.at {
				r.clk.Set(t0.Add(at))
				r.fail()
			}
			if got := r.state() == breaker.Open; got != tc.opened {
				t.Fatalf("opened=%v want %v (%v)", got, tc.opened, r.transitions())
			}
		})
	}
	// The count returns to 0 in one step at expiry.
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 10 }))
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
func testSlidingWindow(t *testing.T, f Factory) {
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
			r := newRig(t, f, pol(func(p *breaker.Policy) { p.Window = breaker.WindowSliding }))
			for _, at := range tc.at {
				r.clk.Set(t0.Add(at))
				r.fail()
			}
			if got := r.state() == breaker.Open; got != tc.opened {
				t.Fatalf("opened=%v want %v", got, tc.opened)
			}
		})
	}
}

// R-T1..R-T4.
func testTriggers(t *testing.T, f Factory) {
	cases := []struct {
		name   string
		policy func(*breaker.Policy)
		seq    string // f=failure s=success n=neither S=slow success 4=401
		want   breaker.State
		reason string
	}{
		{"consecutive: success resets the run", func(p *breaker.Policy) { p.FailureThreshold = 100; p.ConsecutiveFailures = 3 }, "ffsff", breaker.Closed, ""},
		{"consecutive: neither does not", func(p *breaker.Policy) { p.FailureThreshold = 100; p.ConsecutiveFailures = 3 }, "ffnf", breaker.Open, breaker.ReasonProvider5xx},
		{"consecutive off", func(p *breaker.Policy) { p.FailureThreshold = 100 }, "ffffffff", breaker.Closed, ""},
		{"rate below minimum", func(p *breaker.Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }, "sfs", breaker.Closed, ""},
		{"rate reaches percent", func(p *breaker.Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }, "sfsf", breaker.Open, breaker.ReasonFailureRate},
		{"rate below percent", func(p *breaker.Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 60; p.MinimumRequests = 4 }, "sfsfs", breaker.Closed, ""},
		{"neither not in the rate", func(p *breaker.Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }, "fnnnn", breaker.Closed, ""},
		{"open on status", func(p *breaker.Policy) { p.OpenOnStatusCodes = []int{401} }, "4", breaker.Open, breaker.ReasonOpenStatus},
		{"401 not listed is neither", nil, "444", breaker.Closed, ""},
		{"slow rate", func(p *breaker.Policy) { p.SlowCallMs = 1000; p.SlowCallRatePercent = 50; p.MinimumRequests = 2 }, "Ss", breaker.Open, breaker.ReasonSlowCallRate},
		{"slow rate below minimum", func(p *breaker.Policy) { p.SlowCallMs = 1000; p.SlowCallRatePercent = 50; p.MinimumRequests = 3 }, "Ss", breaker.Closed, ""},
		{"slow off", func(p *breaker.Policy) { p.MinimumRequests = 1 }, "SSSS", breaker.Closed, ""},
		{"threshold", nil, "fff", breaker.Open, breaker.ReasonProvider5xx},
		{"threshold with successes between", nil, "fsfsf", breaker.Open, breaker.ReasonProvider5xx},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, f, pol(tc.policy))
			for _, c := range tc.seq {
				switch c {
				case 'f':
					r.fail()
				case 's':
					r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 10})
				case 'S':
					r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 5000})
				case 'n':
					r.neither()
				case '4':
					r.send(breaker.Result{Kind: breaker.KindStatus, Status: 401})
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
func testFailuresNotCountedWhileOpenOrHalfOpen(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 3; p.HalfOpenMaxProbes = 0 }))
	r.openNow()
	before := r.status()
	r.fail()
	r.fail()
	if s := r.status(); s.Failures != before.Failures || s.WindowFailures != before.WindowFailures {
		t.Fatalf("open counted failures: %+v → %+v", before.Failures, s.Failures)
	}
	r.advance(time.Second)
	if r.state() != breaker.HalfOpen {
		t.Fatal("want half_open")
	}
	r.fail()
	s := r.status()
	if s.State != "open" || s.Failures != before.Failures {
		t.Fatalf("half-open failure: %+v", s)
	}
}

// R-S3: probes are bounded; a neither frees its slot; leases time out.
func testHalfOpenProbes(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.HalfOpenMaxProbes = 2; p.ProbeTimeoutMs = 5000 }))
	r.halfOpenNow()
	a1, ok1 := r.acquire(false)
	_, ok2 := r.acquire(false)
	_, ok3 := r.acquire(false)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("acquires %v %v %v", ok1, ok2, ok3)
	}
	if v := r.peek(); v.Allowed || !v.ProbesFull || v.RecoveryAt != r.now()+5e9 {
		t.Fatalf("peek with full slots: %+v", v)
	}
	if s := r.status(); s.ProbesInFlight != 2 {
		t.Fatalf("probes_in_flight %d", s.ProbesInFlight)
	}
	// A neither frees its slot and changes nothing.
	r.record(a1, breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel})
	if r.state() != breaker.HalfOpen {
		t.Fatal("neither changed state")
	}
	if _, ok := r.acquire(false); !ok {
		t.Fatal("slot not freed by neither")
	}
	// Leases expire after probe_timeout_ms.
	r.advance(5 * time.Second)
	if s := r.status(); s.ProbesInFlight != 0 {
		t.Fatalf("leases not expired: %d", s.ProbesInFlight)
	}
	// Zero = admit everything.
	r2 := newRig(t, f, pol(func(p *breaker.Policy) { p.HalfOpenMaxProbes = 0 }))
	r2.halfOpenNow()
	for i := 0; i < 50; i++ {
		if _, ok := r2.acquire(false); !ok {
			t.Fatal("max_probes 0 must admit every request")
		}
	}
}

func testHalfOpenProbesConcurrent(t *testing.T, f Factory) {
	for _, max := range []int{1, 3, 7} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			r := newRig(t, f, pol(func(p *breaker.Policy) { p.HalfOpenMaxProbes = max }))
			r.halfOpenNow()
			var got = make(chan bool, 200)
			start := make(chan struct{})
			done := make(chan struct{})
			for i := 0; i < 200; i++ {
				go func() {
					<-start
					_, ok := r.acquire(false)
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
func testLateOutcomeFromOldGeneration(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
	old, _ := r.acquire(false) // a long stream starts
	r.halfOpenNow()
	rec := r.record(old, breaker.Result{Kind: breaker.KindAnswered, Status: 200})
	if !rec.Stale {
		t.Fatal("not marked stale")
	}
	if r.state() != breaker.HalfOpen {
		t.Fatalf("stale success changed state to %v", r.state())
	}
	// A stale failure does not re-open either.
	r.record(old, breaker.Result{Kind: breaker.KindStatus, Status: 500})
	if r.state() != breaker.HalfOpen {
		t.Fatal("stale failure re-opened")
	}
	// A closed-state failure from before a force-close does not count after it.
	r2 := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 1 }))
	adm, _ := r2.acquire(false)
	r2.forceClose()
	r2.record(adm, breaker.Result{Kind: breaker.KindStatus, Status: 500})
	if r2.state() != breaker.Closed {
		t.Fatal("pre-override failure counted")
	}
}

// R-S6 drops only an earlier generation's outcome. One admitted under a
// later generation than the store's (a Redis store's view that ran on
// through an episode Redis lost, #54) counts while the breaker is closed,
// and changes nothing while it is half-open: a half-open breaker takes
// only its own generation's probes.
func testOutcomeFromALaterGeneration(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 1 }))
	// One episode first: the state has a history (Redis takes a later
	// generation as its own on a state it has just made, #49).
	r.fail()
	r.reset()
	adm, _ := r.acquire(false)
	adm.Gen += 2
	if rec := r.record(adm, breaker.Result{Kind: breaker.KindStatus, Status: 503}); rec.Stale || r.state() != breaker.Open {
		t.Fatalf("a closed breaker's failure from a later generation: stale %v, state %v, want counted and open", rec.Stale, r.state())
	}
	r.advance(time.Duration(r.p.CooldownMs) * time.Millisecond)
	probe, ok := r.acquire(false)
	if !ok || r.state() != breaker.HalfOpen {
		t.Fatalf("setup: probe admitted %v, state %v", ok, r.state())
	}
	probe.Gen += 2
	if rec := r.record(probe, breaker.Result{Kind: breaker.KindAnswered, Status: 200}); !rec.Stale || r.state() != breaker.HalfOpen {
		t.Fatalf("a half-open breaker's success from a later generation: stale %v, state %v, want stale and half_open", rec.Stale, r.state())
	}
}

// Backoff: cooldown × multiplier^(k-1) for the k-th consecutive opening of
// an episode, capped at max_cooldown_ms; closing resets it.
func testBackoffSequence(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.CooldownMs = 1000; p.BackoffMultiplier = 2; p.MaxCooldownMs = 5000 }))
	r.openNow()
	var got []string
	for i := 0; i < 5; i++ {
		s := r.status()
		got = append(got, fmt.Sprintf("%.0f", (*s.OpenUntil-float64(r.now())/1e9)*1000))
		r.advance(time.Duration(*s.OpenUntil*1e9 - float64(r.now())))
		if r.state() != breaker.HalfOpen {
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
}

// opened_at is the episode's start; re-opens set reopened_at and count.
func testEpisodeTimes(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
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
func testRetryAfterBlock(t *testing.T, f Factory) {
	ra := func(r *rig, status int, d time.Duration) {
		r.send(breaker.Result{Kind: breaker.KindStatus, Status: status, RetryAfterUnixNano: r.now() + int64(d)})
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
		policy func(*breaker.Policy)
		steps  func(r *rig)
		want   float64
	}{
		{"429 blocks", nil, func(r *rig) { ra(r, 429, 30*time.Second) }, 30},
		{"503 blocks", nil, func(r *rig) { ra(r, 503, 30*time.Second) }, 30},
		{"500 does not", nil, func(r *rig) { ra(r, 500, 30*time.Second) }, 0},
		{"shorter never shortens", nil, func(r *rig) { ra(r, 429, 30*time.Second); ra(r, 429, 5*time.Second) }, 30},
		{"longer extends", nil, func(r *rig) { ra(r, 429, 30*time.Second); ra(r, 429, 60*time.Second) }, 60},
		{"capped", func(p *breaker.Policy) { p.MaxRetryAfterSec = 45 }, func(r *rig) { ra(r, 429, time.Hour) }, 45},
		{"ignore", func(p *breaker.Policy) { p.RetryAfter = breaker.RetryAfterIgnore }, func(r *rig) { ra(r, 429, 30*time.Second) }, 0},
		{"in the past", nil, func(r *rig) { ra(r, 429, -time.Second) }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newCaseRig(t, f, tc.policy)
			tc.steps(r)
			if got := blocked(r); got != tc.want {
				t.Fatalf("blocked for %v, want %v", got, tc.want)
			}
			if tc.want > 0 {
				v := r.peek()
				if v.Allowed || !v.Blocked || r.state() != breaker.Closed {
					t.Fatalf("block must skip the route independent of state: %+v", v)
				}
				r.advance(time.Duration(tc.want * float64(time.Second)))
				if v := r.peek(); !v.Allowed {
					t.Fatalf("still blocked after the deadline: %+v", v)
				}
			}
		})
	}
	// Reset clears a block; force-close keeps it.
	r := newRig(t, f, pol(nil))
	ra(r, 429, 30*time.Second)
	r.forceClose()
	if blocked(r) == 0 {
		t.Fatal("force-close cleared the block")
	}
	r.reset()
	if blocked(r) != 0 {
		t.Fatal("reset kept the block")
	}
}

// R-S5: forced open is never probed; its duration ends in a cleared close.
func testForceOpen(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
	r.fail()
	r.forceOpen(10 * time.Second)
	v := r.peek()
	if v.Allowed || !v.Forced || v.RecoveryAt != r.now()+10e9 {
		t.Fatalf("forced verdict %+v", v)
	}
	r.advance(5 * time.Second)
	if r.state() != breaker.Open {
		t.Fatal("forced open half-opened")
	}
	if adm, ok := r.acquire(false); ok || adm.Lease != 0 {
		t.Fatal("forced open admitted a probe")
	}
	r.advance(5 * time.Second)
	r.sweep()
	s := r.status()
	if s.State != "closed" || s.Forced || s.Failures != 0 {
		t.Fatalf("after the duration: %+v", s)
	}
	if evs := r.transitions(); evs[len(evs)-1] != "open->closed:force_expired" {
		t.Fatalf("events %v", evs)
	}
	// Without a duration: never recovers.
	r.forceOpen(0)
	if v := r.peek(); v.RecoveryAt != breaker.Never {
		t.Fatalf("recovery %d", v.RecoveryAt)
	}
	r.advance(time.Hour)
	if r.state() != breaker.Open {
		t.Fatal("forced open without duration ended")
	}
	// Force-close closes once; it does not pin.
	r.forceClose()
	r.openNow()
}

// R-S2: a due transition is made by the sweep, once; a read racing the sweep
// makes no duplicate event.
func testSweepMakesDueTransitionsOnce(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
	r.openNow()
	r.advance(time.Second)
	done := make(chan struct{})
	for i := 0; i < 8; i++ {
		go func() {
			r.sweep()
			r.peek()
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

func testTransitionEventFields(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
	r.ok()
	r.openNow()
	r.mu.Lock()
	e := r.evs[0]
	r.mu.Unlock()
	if e.Transition() != "closed->open" || e.Reason != breaker.ReasonProvider5xx || e.Failures != 3 || e.Threshold != 3 ||
		e.PolicyVersion != r.p.Version || e.OpenUntil != r.now()+1e9 || e.WindowCalls != 4 || e.WindowFailures != 3 ||
		e.ID.Gateway != "gw" || e.Provider != "openai" || e.ID.Scope != breaker.ScopeGateway {
		t.Fatalf("event %+v", e)
	}
}

// R-P9: a policy change keeps state; new thresholds apply from the next
// outcome.
func testPolicyChangeKeepsState(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 5 }))
	r.fail()
	r.fail()
	r.install(pol(func(p *breaker.Policy) { p.FailureThreshold = 3 }))
	if s := r.status(); s.Failures != 2 || s.PolicyVersion != r.p.Version {
		t.Fatalf("state lost on policy change: %+v", s)
	}
	r.fail()
	if r.state() != breaker.Open {
		t.Fatal("new threshold not applied")
	}
	// A window resize keeps the buckets that still fit.
	r2 := newRig(t, f, pol(func(p *breaker.Policy) { p.Window = breaker.WindowSliding; p.FailureThreshold = 10; p.WindowSec = 60 }))
	r2.fail()
	r2.advance(20 * time.Second)
	r2.fail()
	r2.install(pol(func(p *breaker.Policy) { p.Window = breaker.WindowSliding; p.FailureThreshold = 10; p.WindowSec = 10 }))
	if f := r2.status().Failures; f != 1 {
		t.Fatalf("after shrinking the window: %d failures", f)
	}
}
