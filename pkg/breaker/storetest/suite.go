package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Run holds the store made by f to the whole contract.
func Run(t *testing.T, f Factory) {
	cases := []struct {
		name string
		fn   func(*testing.T, Factory)
	}{
		{"TransitionsFromEveryState", testTransitionsFromEveryState},
		{"TumblingWindow", testTumblingWindow},
		{"SlidingWindow", testSlidingWindow},
		{"Triggers", testTriggers},
		{"FailureRateEvaluatedOnSuccess", testFailureRateEvaluatedOnSuccess},
		{"FailuresNotCountedWhileOpenOrHalfOpen", testFailuresNotCountedWhileOpenOrHalfOpen},
		{"HalfOpenProbes", testHalfOpenProbes},
		{"HalfOpenProbesConcurrent", testHalfOpenProbesConcurrent},
		{"LateOutcomeFromOldGeneration", testLateOutcomeFromOldGeneration},
		{"OutcomeFromALaterGeneration", testOutcomeFromALaterGeneration},
		{"AdmissionGenerationIsConsistent", testAdmissionGenerationIsConsistent},
		{"BackoffSequence", testBackoffSequence},
		{"EpisodeTimes", testEpisodeTimes},
		{"RetryAfterBlock", testRetryAfterBlock},
		{"RetryAfterNeverBlocksAFleet", testRetryAfterNeverBlocksAFleet},
		{"Saturation", testSaturation},
		{"ForceOpen", testForceOpen},
		{"SweepMakesDueTransitionsOnce", testSweepMakesDueTransitionsOnce},
		{"TransitionEventFields", testTransitionEventFields},
		{"EventsInOrder", testEventsInOrder},
		{"PolicyChangeKeepsState", testPolicyChangeKeepsState},
		{"InFlightOutcomeJudgedWithInstalledPolicy", testInFlightOutcomeJudgedWithInstalledPolicy},
		{"ShadowBreaker", testShadowBreaker},
		{"OffBreaker", testOffBreaker},
		{"InstallAddsKeepsAndRemoves", testInstallAddsKeepsAndRemoves},
		{"FleetJudgesWithItsOwnPolicy", testFleetJudgesWithItsOwnPolicy},
		{"StallCountsAtOnce", testStallCountsAtOnce},
		{"BaselineSlowCalls", testBaselineSlowCalls},
		{"Notes", testNotes},
		{"RecoveryRamp", testRecoveryRamp},
		{"Vectors", testVectors},
		{"Journal", testJournal},
		{"KeyedRecordsApplyOnce", testKeyedRecordsApplyOnce},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, f) })
	}
}

// R-T2: the success that brings the volume up to minimum_requests can open
// the breaker (resilience4j evaluates after every outcome).
func testFailureRateEvaluatedOnSuccess(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 100; p.FailureRatePercent = 50; p.MinimumRequests = 4 }))
	r.fail()
	r.fail()
	r.ok()
	if r.state() != breaker.Closed {
		t.Fatal("opened below minimum_requests")
	}
	r.ok() // 2 of 4 failed: 50 %
	if s := r.status(); s.State != "open" || s.Reason != breaker.ReasonFailureRate {
		t.Fatalf("want open on failure_rate after the 4th outcome (a success), got %+v", s)
	}
}

// R-S6 with the lock-free path: an admission taken on a closed breaker always
// carries the generation that breaker was closed in. If it paired the flags
// of one moment with the generation of another, a success recorded for a
// request admitted just after a close would be dropped as stale.
func testAdmissionGenerationIsConsistent(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) {
		p.HalfOpenMaxProbes = 1
		p.FailureThreshold = 1000000
		p.ConsecutiveFailures = 1
	}))
	for round := 0; round < 300; round++ {
		r.fail() // consecutive_failures 1: open
		r.advance(time.Second)
		probe, ok := r.acquire(false)
		if !ok || probe.Lease == 0 {
			t.Fatalf("round %d: no probe slot", round)
		}
		var wg sync.WaitGroup
		adms := make([]breaker.Admission, 8)
		oks := make([]bool, 8)
		for i := range adms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				adms[i], oks[i], _ = r.st.Acquire(ctx, r.k, r.now(), false)
			}()
		}
		r.record(probe, breaker.Result{Kind: breaker.KindAnswered, Status: 200}) // closes
		wg.Wait()
		for i := range adms {
			if !oks[i] || adms[i].Lease != 0 {
				continue // refused, or half-open with a slot: not the closed path
			}
			rec := r.record(adms[i], breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel})
			if rec.Stale {
				t.Fatalf("round %d: an admission on the closed breaker carried an older generation", round)
			}
		}
	}
}

// R-A1: a Retry-After blocks the route that answered, never its fleet.
func testRetryAfterNeverBlocksAFleet(t *testing.T, f Factory) {
	st := f(t, nil)
	now := t0.UnixNano()
	fleetP := pol(func(p *breaker.Policy) { p.FailureThreshold = 100; p.FailureStatusCodes = []int{429, 500} })
	keys, _, err := st.Install(ctx, now, []breaker.Spec{
		{ID: breaker.RouteID("gw", "self:a:m"), Policy: pol(func(p *breaker.Policy) { p.FailureThreshold = 100 })},
		{ID: breaker.FleetID("gpu"), Policy: fleetP},
	})
	if err != nil {
		t.Fatal(err)
	}
	tg := breaker.Target{Route: keys[0], Fleet: keys[1], HasFleet: true}
	a, _ := tg.Acquire(ctx, st, now, false)
	route, fleet, err := tg.Record(ctx, st, now, a, breaker.Result{Kind: breaker.KindStatus, Status: 429, RetryAfterUnixNano: now + 30e9})
	if err != nil || fleet.Outcome.Class != breaker.Failure || route.Outcome.Class != breaker.Neither {
		t.Fatalf("outcomes route %+v fleet %+v err %v", route, fleet, err)
	}
	rs, _ := st.Status(ctx, keys[0], now)
	fs, _ := st.Status(ctx, keys[1], now)
	if rs.BlockedUntil == nil {
		t.Fatal("the route that answered 429 with Retry-After is not blocked")
	}
	if fs.BlockedUntil != nil {
		t.Fatalf("the fleet was blocked: %+v", fs)
	}
	if v := st.Peek(ctx, keys[1], now); !v.Allowed {
		t.Fatalf("fleet verdict %+v", v)
	}
}

// Listeners see a breaker's transitions in the order they happened, even
// when several goroutines make them.
func testEventsInOrder(t *testing.T, f Factory) {
	var mu sync.Mutex
	var evs []breaker.Event
	st := f(t, func(e breaker.Event) {
		mu.Lock()
		evs = append(evs, e)
		mu.Unlock()
	})
	now := t0.UnixNano()
	keys, _, err := st.Install(ctx, now, []breaker.Spec{{ID: rigID, Policy: pol(nil)}})
	if err != nil {
		t.Fatal(err)
	}
	k := keys[0]
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if (i+g)%2 == 0 {
					_ = st.ForceOpen(ctx, k, now, 0)
				} else {
					_ = st.ForceClose(ctx, k, now)
				}
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(evs) == 0 {
		t.Fatal("no events")
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].From != evs[i-1].To || evs[i].Generation <= evs[i-1].Generation {
			t.Fatalf("event %d out of order: %s gen %d after %s gen %d", i,
				evs[i].Transition(), evs[i].Generation, evs[i-1].Transition(), evs[i-1].Generation)
		}
	}
	last := evs[len(evs)-1]
	if s, _ := st.Status(ctx, k, now); s.State != last.To.String() {
		t.Fatalf("last event says %s, state is %s", last.To, s.State)
	}
}

// R-P9: an outcome is judged with the policy in force when it is recorded,
// never with the one its request started under.
func testInFlightOutcomeJudgedWithInstalledPolicy(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 5 }))
	adm, _ := r.acquire(false) // a stream starts under threshold 5
	r.install(pol(func(p *breaker.Policy) { p.FailureThreshold = 1 }))
	r.record(adm, breaker.Result{Kind: breaker.KindStatus, Status: 500})
	if s := r.status(); s.State != "open" || s.PolicyVersion != r.p.Version {
		t.Fatalf("in-flight 500 after a reload to threshold 1: %+v", s)
	}
	// A sliding window shrunk by a reload stays shrunk.
	r2 := newRig(t, f, pol(func(p *breaker.Policy) { p.Window = breaker.WindowSliding; p.FailureThreshold = 100; p.WindowSec = 60 }))
	old, _ := r2.acquire(false)
	for i := 0; i < 4; i++ {
		r2.fail()
		r2.advance(5 * time.Second)
	}
	r2.install(pol(func(p *breaker.Policy) { p.Window = breaker.WindowSliding; p.FailureThreshold = 100; p.WindowSec = 10 }))
	r2.record(old, breaker.Result{Kind: breaker.KindStatus, Status: 500})
	if got := r2.status().Failures; got != 2 {
		t.Fatalf("failures in the new 10 s window: %d, want 2 (one at -5 s, the in-flight one)", got)
	}
}

// R-M4: a shadow breaker tracks health, reports it, never takes a probe slot
// and never refuses.
func testShadowBreaker(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.Mode = breaker.ModeShadow }))
	r.halfOpenNow()
	for i := 0; i < 5; i++ {
		adm, ok := r.acquire(false)
		if !ok || adm.Lease != 0 {
			t.Fatalf("shadow acquire %+v %v", adm, ok)
		}
	}
	if s := r.status(); s.ProbesInFlight != 0 {
		t.Fatalf("shadow took slots: %+v", s)
	}
	r.install(pol(func(p *breaker.Policy) { p.Mode = breaker.ModeShadow; p.FailureThreshold = 1 }))
	r.ok() // a success still closes: health is tracked
	r.fail()
	v := r.peek()
	if !v.Shadow || v.Allowed || v.State != breaker.Open {
		t.Fatalf("shadow verdict %+v", v)
	}
}

// R-M1/R-M4: an off breaker is neither consulted nor recorded.
func testOffBreaker(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) { p.Mode = breaker.ModeOff; p.FailureThreshold = 1 }))
	for i := 0; i < 3; i++ {
		if rec := r.send(breaker.Result{Kind: breaker.KindStatus, Status: 500}); rec.Applied {
			t.Fatalf("off breaker applied %+v", rec)
		}
	}
	if v := r.peek(); !v.Allowed || !v.Off {
		t.Fatalf("off verdict %+v", v)
	}
	if s := r.status(); s.State != "closed" || s.WindowCalls != 0 {
		t.Fatalf("off breaker recorded: %+v", s)
	}
	r.install(pol(func(p *breaker.Policy) { p.Enabled = false; p.FailureThreshold = 1 }))
	if rec := r.send(breaker.Result{Kind: breaker.KindStatus, Status: 500}); rec.Applied || r.state() != breaker.Closed {
		t.Fatal("disabled breaker recorded")
	}
}

// R-P11: Install creates every breaker closed, keeps state across a
// reinstall, and removes what is no longer configured.
func testInstallAddsKeepsAndRemoves(t *testing.T, f Factory) {
	st := f(t, nil)
	now := t0.UnixNano()
	a, b := breaker.RouteID("gw", "p:a:m"), breaker.RouteID("gw", "p:b:m")
	p := pol(func(p *breaker.Policy) { p.FailureThreshold = 1 })
	keys, removed, err := st.Install(ctx, now, []breaker.Spec{{ID: a, Policy: p}, {ID: b, Policy: p}})
	if err != nil || len(keys) != 2 || len(removed) != 0 {
		t.Fatalf("install: %v %v %v", keys, removed, err)
	}
	for _, k := range keys {
		if s, err := st.Status(ctx, k, now); err != nil || s.State != "closed" || s.PolicyVersion != p.Version {
			t.Fatalf("new breaker %v: %+v %v", k.ID(), s, err)
		}
	}
	adm, _, _ := st.Acquire(ctx, keys[0], now, false)
	if _, err := st.Record(ctx, keys[0], now, adm, breaker.Result{Kind: breaker.KindStatus, Status: 500}); err != nil {
		t.Fatal(err)
	}
	keys2, removed, err := st.Install(ctx, now, []breaker.Spec{{ID: a, Policy: pol(nil)}})
	if err != nil || len(removed) != 1 || removed[0] != b {
		t.Fatalf("reinstall removed %v, %v", removed, err)
	}
	if s, _ := st.Status(ctx, keys2[0], now); s.State != "open" {
		t.Fatalf("state lost across reinstall: %+v", s)
	}
	// The old key still names a, by ID.
	if s, err := st.Status(ctx, breaker.KeyOf(a), now); err != nil || s.State != "open" {
		t.Fatalf("lookup by ID: %+v %v", s, err)
	}
	if _, err := st.Status(ctx, keys[1], now); !errors.Is(err, breaker.ErrUnknown) {
		t.Fatalf("removed breaker: err %v", err)
	}
	if _, err := st.Record(ctx, keys[1], now, breaker.Admission{}, breaker.Result{Kind: breaker.KindStatus, Status: 500}); !errors.Is(err, breaker.ErrUnknown) {
		t.Fatalf("record on a removed breaker: %v", err)
	}
	if v := st.Peek(ctx, keys[1], now); !v.Allowed {
		t.Fatalf("peek on a removed breaker must answer allowed: %+v", v)
	}
	// Re-adding starts afresh.
	keys3, _, _ := st.Install(ctx, now, []breaker.Spec{{ID: a, Policy: p}, {ID: b, Policy: p}})
	if s, _ := st.Status(ctx, keys3[1], now); s.State != "closed" || s.Generation == 0 {
		t.Fatalf("re-added breaker: %+v", s)
	}
}

// Fleets judge the same attempt with their own policy, across gateways.
func testFleetJudgesWithItsOwnPolicy(t *testing.T, f Factory) {
	st := f(t, nil)
	now := t0.UnixNano()
	routeP := pol(func(p *breaker.Policy) { p.FailureThreshold = 2 })
	fleetP := pol(func(p *breaker.Policy) { p.FailureThreshold = 2; p.FailureStatusCodes = []int{429, 500} })
	keys, _, err := st.Install(ctx, now, []breaker.Spec{
		{ID: breaker.RouteID("gw", "self:a:m"), Policy: routeP},
		{ID: breaker.RouteID("gw2", "self:b:m"), Policy: routeP},
		{ID: breaker.FleetID("gpu"), Policy: fleetP},
	})
	if err != nil {
		t.Fatal(err)
	}
	tg := breaker.Target{Route: keys[0], Fleet: keys[2], HasFleet: true}
	other := breaker.Target{Route: keys[1], Fleet: keys[2], HasFleet: true}
	for i := 0; i < 2; i++ {
		a, ok := tg.Acquire(ctx, st, now, false)
		if !ok {
			t.Fatal("refused")
		}
		route, fleet, err := tg.Record(ctx, st, now, a, breaker.Result{Kind: breaker.KindStatus, Status: 429})
		if err != nil || !fleet.Applied || route.Outcome.Class != breaker.Neither || fleet.Outcome.Class != breaker.Failure {
			t.Fatalf("429: route %v fleet %v", route.Outcome, fleet.Outcome)
		}
	}
	if v := st.Peek(ctx, keys[0], now); !v.Allowed {
		t.Fatal("route breaker opened on a 429 it does not count")
	}
	if v := other.Peek(ctx, st, now); v.Allowed || v.State != breaker.Open {
		t.Fatalf("fleet open must block other gateways' routes: %+v", v)
	}
	if s, _ := st.Status(ctx, keys[2], now); s.Scope != breaker.ScopeGlobal {
		t.Fatal("fleet scope")
	}
}

// R-T5: a stream that stalls is a slow call the moment it stalls, not when
// it ends; its outcome does not count it twice; the transition names the
// signal.
func testStallCountsAtOnce(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) {
		p.FailureThreshold = 100
		p.StallMs = 1000
		p.SlowCallRatePercent = 50
		p.MinimumRequests = 3
	}))
	r.ok()
	r.ok()
	adm, _ := r.acquire(false) // a stream that will stall
	if err := r.st.Stalled(ctx, r.k, r.now()); err != nil {
		t.Fatal(err)
	}
	if s := r.status(); s.WindowCalls != 3 || s.WindowSlowCalls != 1 || s.State != "closed" {
		t.Fatalf("after one stall: %+v", s)
	}
	// It ends later, answered: counted once, as one call.
	r.record(adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200, MaxGapMs: 5000, Counted: true})
	if s := r.status(); s.WindowCalls != 3 || s.WindowSlowCalls != 1 {
		t.Fatalf("the stalled attempt was counted twice: %+v", s)
	}
	// Another stall while still running: 2 slow of 4 opens, at once.
	if err := r.st.Stalled(ctx, r.k, r.now()); err != nil {
		t.Fatal(err)
	}
	if s := r.status(); s.State != "open" || s.Reason != breaker.ReasonSlowCallRateStall {
		t.Fatalf("want open on slow_call_rate:stall, got %+v", s)
	}
	// Without stall_ms nothing is counted.
	r2 := newRig(t, f, pol(nil))
	if err := r2.st.Stalled(ctx, r2.k, r2.now()); err != nil {
		t.Fatal(err)
	}
	if s := r2.status(); s.WindowCalls != 0 {
		t.Fatalf("stall counted without stall_ms: %+v", s)
	}
}

// R-T6: an attempt slower than k × the route's baseline is slow; the
// transition says so.
func testBaselineSlowCalls(t *testing.T, f Factory) {
	r := newRig(t, f, pol(func(p *breaker.Policy) {
		p.FailureThreshold = 100
		p.BaselineMultiplier = 3
		p.SlowCallRatePercent = 50
		p.MinimumRequests = 4
	}))
	fast := breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 250, BaselineMs: 100}
	slow := breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 350, BaselineMs: 100}
	nobase := breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 5000}
	r.send(fast)
	r.send(nobase) // no baseline yet: never slow by it
	r.send(slow)
	if s := r.status(); s.State != "closed" || s.WindowSlowCalls != 1 {
		t.Fatalf("%+v", s)
	}
	r.send(slow)
	if s := r.status(); s.State != "open" || s.Reason != breaker.ReasonSlowCallRateBaseline {
		t.Fatalf("want open on slow_call_rate:baseline, got %+v", s)
	}
}
