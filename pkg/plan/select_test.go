package plan

import (
	"fmt"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

func TestSelect(t *testing.T) {
	const now = int64(1_000_000_000_000)
	ok := breaker.Verdict{Allowed: true}
	open := func(recSec int64) breaker.Verdict {
		return breaker.Verdict{State: breaker.Open, RecoveryAt: now + recSec*1e9}
	}
	blocked := func(recSec int64) breaker.Verdict {
		return breaker.Verdict{Blocked: true, RecoveryAt: now + recSec*1e9}
	}
	forced := breaker.Verdict{State: breaker.Open, Forced: true, RecoveryAt: breaker.Never}
	cases := []struct {
		name       string
		v          []breaker.Verdict
		eject      int
		when       string
		order      string
		skipped    string
		tryAll     bool
		failFast   bool
		retryAfter int64
	}{
		{"all healthy", []breaker.Verdict{ok, ok, ok}, 100, "try_all", "[0 1 2]", "[]", false, false, 0},
		{"skip the open one", []breaker.Verdict{open(5), ok, ok}, 100, "try_all", "[1 2]", "[0]", false, false, 0},
		{"skip blocked", []breaker.Verdict{blocked(5), ok}, 100, "try_all", "[1]", "[0]", false, false, 0},
		// R-F2: 50% of 3 = 1 skip at most; the closer to recovery is kept.
		{"floor keeps closest to recovery", []breaker.Verdict{open(30), open(10), ok}, 50, "try_all", "[1 2]", "[0]", false, false, 0},
		{"floor ties in routing order", []breaker.Verdict{open(10), open(10), ok}, 50, "try_all", "[0 2]", "[1]", false, false, 0},
		{"floor 0 skips nothing", []breaker.Verdict{open(10), open(20)}, 0, "try_all", "[0 1]", "[]", false, false, 0},
		// R-S5: forced open is removed before the floor.
		{"forced beats the floor", []breaker.Verdict{forced, ok}, 0, "try_all", "[1]", "[0]", false, false, 0},
		// R-F3 try_all keeps every candidate but forced ones, blocked last.
		{"try_all", []breaker.Verdict{blocked(5), open(10), forced, open(3)}, 100, "try_all", "[1 3 0]", "[2]", true, false, 0},
		{"fail_fast", []breaker.Verdict{open(10), open(3)}, 100, "fail_fast", "[]", "[0 1]", false, true, 3},
		{"fail_fast rounds up", []breaker.Verdict{{State: breaker.Open, RecoveryAt: now + 2500e6}}, 100, "fail_fast", "[]", "[0]", false, true, 3},
		{"fail_fast at least 1", []breaker.Verdict{{State: breaker.Open, RecoveryAt: now}}, 100, "fail_fast", "[]", "[0]", false, true, 1},
		{"only forced left fails fast", []breaker.Verdict{forced, forced}, 100, "try_all", "[]", "[0 1]", false, true, 60},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := Select(now, tc.v, tc.eject, tc.when, nil, nil)
			if got := fmt.Sprint(s.Order); got != tc.order {
				t.Errorf("order %s want %s", got, tc.order)
			}
			if got := fmt.Sprint(s.Skipped); got != tc.skipped {
				t.Errorf("skipped %s want %s", got, tc.skipped)
			}
			if s.TryAll != tc.tryAll || s.FailFast != tc.failFast || s.RetryAfterSec != tc.retryAfter {
				t.Errorf("tryAll=%v failFast=%v retry=%d", s.TryAll, s.FailFast, s.RetryAfterSec)
			}
		})
	}
}

func TestSelectNoAllocWhenHealthy(t *testing.T) {
	v := []breaker.Verdict{{Allowed: true}, {Allowed: true}}
	dst, sk := make([]int, 0, 4), make([]int, 0, 4)
	if n := testing.AllocsPerRun(100, func() { Select(0, v, 100, "try_all", dst, sk) }); n != 0 {
		t.Fatalf("allocs %v", n)
	}
}

// R-H2: a saturated route is passed over while another in the order can
// take the request; it never counts toward the floor, and never empties a
// model: with every candidate in the order saturated, the earliest end
// goes first. Saturation is independent of health.
func TestSelectPassesSaturated(t *testing.T) {
	const now = int64(1_000_000_000_000)
	ok := breaker.Verdict{Allowed: true}
	sat := func(untilSec int64) breaker.Verdict {
		return breaker.Verdict{Allowed: true, Saturated: true, SaturatedUntil: now + untilSec*1e9}
	}
	open := breaker.Verdict{State: breaker.Open, RecoveryAt: now + 5e9}
	cases := []struct {
		name                   string
		v                      []breaker.Verdict
		eject                  int
		order, skipped, passed string
	}{
		{"one saturated", []breaker.Verdict{sat(30), ok}, 100, "[1]", "[]", "[0]"},
		{"every route saturated: the earliest end first", []breaker.Verdict{sat(30), sat(10), sat(20)}, 100, "[1 2 0]", "[]", "[]"},
		{"open and saturated: the saturated one takes it", []breaker.Verdict{open, sat(30)}, 100, "[1]", "[0]", "[]"},
		{"open, saturated, healthy", []breaker.Verdict{open, sat(30), ok}, 100, "[2]", "[0]", "[1]"},
		// The floor (50 % of 2: one skip) counts the open one only.
		{"the floor does not count judge.Saturation", []breaker.Verdict{sat(30), open}, 50, "[0]", "[1]", "[]"},
	}
	for _, c := range cases {
		sel := Select(now, c.v, c.eject, breaker.WhenAllOpenTryAll, nil, nil)
		if got := fmt.Sprint(sel.Order); got != c.order {
			t.Errorf("%s: order %s, want %s", c.name, got, c.order)
		}
		if got := fmt.Sprint(sel.Skipped); got != c.skipped {
			t.Errorf("%s: skipped %s, want %s", c.name, got, c.skipped)
		}
		if got := fmt.Sprint(append([]int{}, sel.Saturated...)); got != c.passed {
			t.Errorf("%s: passed over %s, want %s", c.name, got, c.passed)
		}
		if sel.TryAll || sel.FailFast {
			t.Errorf("%s: try_all %v fail_fast %v", c.name, sel.TryAll, sel.FailFast)
		}
	}
}
