package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// R-H3: one replica learns that a route's quota is nearly gone, and the
// whole fleet passes it over at once: every replica's view (no round trip
// per decision) shows it saturated until the reset, and a later answer
// that announced enough ends it everywhere. The start is reported once,
// by the replica whose record made it.
func TestSaturationIsFleetWide(t *testing.T) {
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, srv.Client(t), "sat:", clk, replicaPolicy(nil), 3, time.Second)
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	record := func(r *replica, res breaker.Result) {
		t.Helper()
		adm, _, _ := r.st.Acquire(ctx, r.key, now(), false)
		if _, err := r.st.Record(ctx, r.key, now(), adm, res); err != nil {
			t.Fatal(err)
		}
	}
	record(rs[0], breaker.Result{Kind: breaker.KindAnswered, Status: 200, SaturateUntil: now() + int64(30*time.Second)})
	for i, r := range rs {
		eventually(t, fmt.Sprintf("replica %d sees it saturated", i), func() bool {
			v := r.st.Peek(ctx, r.key, now())
			return v.Saturated && v.Allowed
		})
	}
	if starts := countEvents(rs, func(e breaker.Event) bool { return e.Saturation == breaker.SaturationStarted }); starts != 1 {
		t.Fatalf("the saturation reported %d times across the replicas, want once", starts)
	}
	clk.Advance(time.Second)
	record(rs[2], breaker.Result{Kind: breaker.KindAnswered, Status: 200, Unsaturate: true, DecidedAt: now()})
	for i, r := range rs {
		eventually(t, fmt.Sprintf("replica %d sees it end", i), func() bool { return !r.st.Peek(ctx, r.key, now()).Saturated })
	}
}

// R-H8 (#49): a deadline a store keeps travels as a duration and becomes
// Redis's own time. A replica whose clock is 10 s behind Redis's, or ahead
// of it, saturates and blocks the fleet for what the provider announced
// (30 s), no more and no less. Before, saturate_until and retry_after went
// as the replica's absolute time: the one behind never saturated or blocked
// the fleet (its deadline was already past on Redis's clock), the one ahead
// did so for its skew longer.
func TestDeadlinesTravelAsDurations(t *testing.T) {
	for _, skew := range []time.Duration{-10 * time.Second, 10 * time.Second} {
		t.Run(fmt.Sprintf("replica clock %v", skew), func(t *testing.T) {
			srv := redistest.Start(t)
			skewed := breaker.NewFakeClock(time.Now().Add(skew))
			p := replicaPolicy(func(p *breaker.Policy) { p.MaxRetryAfterSec = 120 })
			// Real time in the script (Redis TIME), as in production.
			a := replicasWith(t, srv.Client(t), "skew:", skewed, p, 1, time.Second, func(_ int, o *redisstore.Options) { o.TestClock = false })[0]
			b := replicasWith(t, srv.Client(t), "skew:", breaker.SystemClock{}, p, 1, time.Second, func(_ int, o *redisstore.Options) {
				o.TestClock, o.ReplicaID = false, "b"
			})[0]
			ctx := context.Background()
			at := skewed.Now().UnixNano()
			adm, _, _ := a.st.Acquire(ctx, a.key, at, false)
			res := breaker.Result{Kind: breaker.KindStatus, Status: 429, SaturateUntil: at + int64(30*time.Second),
				RetryAfterUnixNano: at + int64(30*time.Second)}
			if _, err := a.st.Record(ctx, a.key, at, adm, res); err != nil {
				t.Fatal(err)
			}
			var s breaker.Status
			eventually(t, "saturated and blocked in Redis", func() bool {
				var err error
				s, err = b.st.Status(ctx, b.key, time.Now().UnixNano())
				return err == nil && s.Saturated && s.BlockedUntil != nil
			})
			for what, until := range map[string]float64{"saturation": *s.SaturatedUntil, "block": *s.BlockedUntil} {
				if left := until - float64(time.Now().UnixNano())/1e9; left < 25 || left > 31 {
					t.Fatalf("the %s ends in %.1f s on Redis's clock, want about 30", what, left)
				}
			}
		})
	}
}
