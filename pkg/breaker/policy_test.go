package breaker

import (
	"reflect"
	"testing"
)

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
		// A reason never overrides what the kind and the policy say.
		{Result{Kind: KindStatus, Status: 500, Reason: ReasonStreamError}, Failure, ReasonProvider5xx, false},
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

func TestCooldownFor(t *testing.T) {
	if cooldownFor(pol(nil), 7) != 1000*1e6 {
		t.Fatal("multiplier 1 must not back off")
	}
	// R-P1's largest values cannot overflow: 86400000 ms capped, ×100.
	p := pol(func(p *Policy) { p.CooldownMs = 86400000; p.MaxCooldownMs = 86400000; p.BackoffMultiplier = 100 })
	if got := cooldownFor(p, 1000); got != 86400000*1e6 || got <= 0 {
		t.Fatalf("cooldown %d", got)
	}
}

// A sliding window's memory is bounded whatever window_sec says.
func TestSlidingWindowBounded(t *testing.T) {
	s := newSliding(86400)
	if len(s.buckets) > maxBuckets {
		t.Fatalf("%d buckets", len(s.buckets))
	}
	now := int64(1_800_000_000e9)
	s.add(now, true, true, false)
	s.add(now+86399e9, true, false, false)
	if c, f, _ := s.totals(now + 86399e9); c != 2 || f != 1 {
		t.Fatalf("totals %d %d", c, f)
	}
	if c, _, _ := s.totals(now + 86400e9 + 720e9); c != 1 {
		t.Fatalf("after the first slid out: %d", c)
	}
}

// The Verdict's int64s come first (see its comment: the decision's copy
// of it stalls otherwise).
func TestVerdictIsWidestFirst(t *testing.T) {
	vt := reflect.TypeOf(Verdict{})
	last := uintptr(8)
	for i := range vt.NumField() {
		f := vt.Field(i)
		if f.Type.Size() > last {
			t.Fatalf("Verdict.%s (%d bytes) comes after a narrower field", f.Name, f.Type.Size())
		}
		last = f.Type.Size()
	}
}
