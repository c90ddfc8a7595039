package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Saturation (R-H2, R-H3): a result that announced less quota than the
// route's headroom floors saturates the route until the announced reset,
// capped by max_retry_after_sec and extended, never shortened; a later one
// that announced enough ends it early if its request was decided after the
// saturation began (R-H7); a reset ends it; no failure is counted and the
// breaker stays healthy (Allowed: selection passes it over). A start and an
// end are events. A fleet breaker is never saturated (the quota is the
// route's credential's).
func testSaturation(t *testing.T, f Factory) {
	sat := func(r *rig, d time.Duration) {
		r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, SaturateUntil: r.now() + int64(d)})
	}
	left := func(r *rig) float64 {
		v := r.peek()
		s := r.status()
		if !v.Saturated {
			if s.Saturated || s.SaturatedUntil != nil {
				r.t.Fatalf("the verdict is not saturated, the status is: %+v", s)
			}
			return 0
		}
		if !v.Allowed || s.State != "closed" || s.Failures != 0 || s.SaturatedUntil == nil {
			r.t.Fatalf("saturated: verdict %+v, status %+v (want allowed, closed, no failure)", v, s)
		}
		return *s.SaturatedUntil - float64(r.now())/1e9
	}
	cases := []struct {
		name   string
		policy func(*breaker.Policy)
		steps  func(r *rig)
		want   float64
		events string
	}{
		{"announced below the floor", nil, func(r *rig) { sat(r, 30*time.Second) }, 30, "[saturated]"},
		{"capped", func(p *breaker.Policy) { p.MaxRetryAfterSec = 45 }, func(r *rig) { sat(r, 48*time.Hour) }, 45, "[saturated]"},
		{"shorter never shortens", nil, func(r *rig) { sat(r, 30*time.Second); sat(r, 5*time.Second) }, 30, "[saturated]"},
		{"longer extends", nil, func(r *rig) { sat(r, 30*time.Second); sat(r, 60*time.Second) }, 60, "[saturated]"},
		{"enough ends it early", nil, func(r *rig) {
			sat(r, 30*time.Second)
			r.advance(time.Second)
			r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, Unsaturate: true, DecidedAt: r.now()})
		}, 0, "[saturated unsaturated]"},
		// R-H7: a response to a request decided before the quota ran down
		// says nothing about the quota now.
		{"enough from an older request does not end it", nil, func(r *rig) {
			decided := r.now()
			r.advance(time.Second)
			sat(r, 30*time.Second)
			r.advance(time.Second)
			r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, Unsaturate: true, DecidedAt: decided})
		}, 29, "[saturated]"},
		{"enough with no decision time does not end it", nil, func(r *rig) {
			sat(r, 30*time.Second)
			r.send(breaker.Result{Kind: breaker.KindAnswered, Status: 200, Unsaturate: true})
		}, 30, "[saturated]"},
		{"it ends at the reset", nil, func(r *rig) { sat(r, 30*time.Second); r.advance(30 * time.Second); r.sweep() }, 0, "[saturated unsaturated]"},
		{"a reset in the past is none", nil, func(r *rig) { sat(r, -time.Second) }, 0, "[]"},
		{"a failure with it counts as a failure, no more", nil, func(r *rig) {
			r.send(breaker.Result{Kind: breaker.KindStatus, Status: 503, SaturateUntil: r.now() + 30e9})
		}, 30, "[saturated]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newCaseRig(t, f, tc.policy)
			tc.steps(r)
			if tc.name == "a failure with it counts as a failure, no more" {
				if s := r.status(); s.Failures != 1 || !s.Saturated {
					t.Fatalf("%+v", s)
				}
				return
			}
			if got := left(r); got != tc.want {
				t.Fatalf("saturated for %v s, want %v", got, tc.want)
			}
			if got := fmt.Sprint(r.saturations()); got != tc.events {
				t.Fatalf("events %s, want %s", got, tc.events)
			}
			if tr := r.transitions(); len(tr) != 0 {
				t.Fatalf("transitions %v: saturation is none", tr)
			}
		})
	}

	// An operator's reset clears a saturation as it clears a Retry-After
	// block: an announced quota of 0 must not pin a route for up to
	// max_retry_after_sec with no override.
	t.Run("a reset clears it", func(t *testing.T) {
		r := newCaseRig(t, f, nil)
		sat(r, 30*time.Second)
		r.reset()
		if got := left(r); got != 0 {
			t.Fatalf("saturated for %v s after a reset", got)
		}
		if got := fmt.Sprint(r.saturations()); got != "[saturated unsaturated]" {
			t.Fatalf("events %s", got)
		}
	})

	t.Run("never a fleet", func(t *testing.T) {
		st := f(t, nil)
		now := t0.UnixNano()
		keys, _, err := st.Install(ctx, now, []breaker.Spec{
			{ID: breaker.RouteID("gw", "self:a:m"), Policy: pol(nil)},
			{ID: breaker.FleetID("gpu"), Policy: pol(nil)},
		})
		if err != nil {
			t.Fatal(err)
		}
		tg := breaker.Target{Route: keys[0], Fleet: keys[1], HasFleet: true}
		a, _ := tg.Acquire(ctx, st, now, false)
		if _, _, err := tg.Record(ctx, st, now, a, breaker.Result{Kind: breaker.KindAnswered, Status: 200, SaturateUntil: now + 30e9}); err != nil {
			t.Fatal(err)
		}
		if v := st.Peek(ctx, keys[0], now); !v.Saturated {
			t.Fatalf("route %+v", v)
		}
		if v := st.Peek(ctx, keys[1], now); v.Saturated {
			t.Fatalf("the fleet was saturated: %+v", v)
		}
	})
}
