package plan

import (
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The draw is a function of the decision id and the route: replay gets the
// same answer for the same decision.
func TestRampDrawIsDeterministic(t *testing.T) {
	a, again := RampDraw("abc", "r"), RampDraw("a"+"bc", "r")
	if a != again {
		t.Fatal("the same decision drew differently")
	}
	seen := map[uint16]bool{}
	for i := range 200 {
		seen[RampDraw(string(rune('a'+i%26))+string(rune('a'+i/26)), "r")] = true
	}
	if len(seen) < 150 {
		t.Fatalf("200 decisions drew only %d distinct values", len(seen))
	}
	if d := RampDraw("0123456789abcdef", "openai:us:gpt"); d >= 1000 {
		t.Fatalf("draw %d out of 0..999", d)
	}
	_ = breaker.Closed
}

// The plan is a pure function: the same verdicts and draws give the same
// order, and the ramp passes over only to a candidate Allowed by its own
// health (table of cases).
func TestPlanRoutesRamp(t *testing.T) {
	ok := breaker.Verdict{Allowed: true, State: breaker.Closed}
	ramping := breaker.Verdict{Allowed: true, State: breaker.Closed, RampPermille: 100}
	open := breaker.Verdict{State: breaker.Open, RecoveryAt: 5}
	forced := breaker.Verdict{State: breaker.Open, Forced: true, RecoveryAt: breaker.Never}
	cases := []struct {
		name   string
		v      []breaker.Verdict
		eject  int
		draw   uint16
		start  int
		ramped int
	}{
		{"draw above the share, a healthy next", []breaker.Verdict{ramping, ok}, 100, 500, 1, 1},
		{"draw below the share", []breaker.Verdict{ramping, ok}, 100, 50, 0, 0},
		{"the next re-admitted by the floor", []breaker.Verdict{ramping, open}, 0, 500, 0, 0},
		{"a healthy one after a re-admitted one", []breaker.Verdict{ramping, open, ok}, 0, 500, 2, 1},
		{"the last candidate", []breaker.Verdict{ramping}, 100, 999, 0, 0},
		{"the next forced open", []breaker.Verdict{ramping, forced}, 100, 500, 0, 0},
		{"two ramping, then healthy", []breaker.Verdict{ramping, ramping, ok}, 100, 500, 2, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanRoutes(0, tc.v, tc.eject, "try_all", fixedRamp{v: tc.v, draw: tc.draw}, nil, nil)
			if p.Start != tc.start || len(p.Ramped) != tc.ramped {
				t.Fatalf("start %d ramped %v, want %d (order %v)", p.Start, p.Ramped, tc.start, p.Order)
			}
		})
	}
}

type fixedRamp struct {
	v    []breaker.Verdict
	draw uint16
}

func (f fixedRamp) Share(i int) uint16 { return f.v[i].RampPermille }
func (f fixedRamp) Draw(int) uint16    { return f.draw }
