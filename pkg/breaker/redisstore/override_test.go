package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestOverridesMadeInAnOutageAreReplayed (R-ST8): an operator's force-open,
// force-close or reset made on a replica that cannot reach Redis is
// replayed when it can, and wins over Redis's natural state. Before, the
// write-back kept Redis's natural open over a force-open, and never wrote
// a force-close or a reset.
func TestOverridesMadeInAnOutageAreReplayed(t *testing.T) {
	cases := []struct {
		name       string
		override   func(st *redisstore.Store, k breaker.Key, now int64) error
		state      string
		wantForced bool
		// naturalAfter: Redis opens on its own after the override (while
		// replica 0 is cut off), not before it.
		naturalAfter bool
	}{
		{"force-open over a natural open", func(st *redisstore.Store, k breaker.Key, now int64) error {
			return st.ForceOpen(context.Background(), k, now, 0)
		}, "open", true, false},
		{"force-open before a later natural open", func(st *redisstore.Store, k breaker.Key, now int64) error {
			return st.ForceOpen(context.Background(), k, now, 0)
		}, "open", true, true},
		{"force-close of a natural open", func(st *redisstore.Store, k breaker.Key, now int64) error {
			return st.ForceClose(context.Background(), k, now)
		}, "closed", false, false},
		{"reset of a natural open", func(st *redisstore.Store, k breaker.Key, now int64) error {
			return st.Reset(context.Background(), k, now)
		}, "closed", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			px := srv.Proxy(t)
			clk := breaker.NewFakeClock(time.Now())
			p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1; p.CooldownMs = 600000 })
			ctx := context.Background()
			// Replica 0 reaches Redis through the proxy; the checker directly.
			c0, err := redisstore.NewClient("redis://" + px.Addr + "/0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c0.Close() })
			r0 := replicasWith(t, c0, "ovr:", clk, p, 1, 100*time.Millisecond, nil)[0]
			check := replicas(t, srv.Client(t), "ovr:", clk, p, 1, time.Second)[0]
			naturalOpen := func() {
				adm, _, _ := check.st.Acquire(ctx, check.key, clk.Now().UnixNano(), false)
				if _, err := check.st.Record(ctx, check.key, clk.Now().UnixNano(), adm, fail503); err != nil {
					t.Fatal(err)
				}
				eventually(t, "open in Redis", func() bool {
					s, _ := check.st.Status(ctx, check.key, clk.Now().UnixNano())
					return s.State == "open"
				})
			}
			if !tc.naturalAfter {
				naturalOpen()
			}
			// Replica 0 loses Redis (what it sends is lost), and the operator acts there.
			px.Blackhole(true)
			clk.Advance(time.Second)
			if err := tc.override(r0.st, r0.key, clk.Now().UnixNano()); err != nil {
				t.Fatal(err)
			}
			eventually(t, "replica 0 degraded", r0.st.Degraded)
			if tc.naturalAfter {
				clk.Advance(time.Second)
				naturalOpen()
			}
			px.Blackhole(false)
			eventually(t, "the override reaches Redis", func() bool {
				s, err := check.st.Status(ctx, check.key, clk.Now().UnixNano())
				return err == nil && s.State == tc.state && s.Forced == tc.wantForced
			})
		})
	}
}

// TestATimedOutOverrideKeepsItsPlace (R-ST8, R-DL11): an operator's
// force-close that Redis did not answer in time (its answer late, or the
// call lost) is sent again when Redis answers, before the failures
// recorded after it and once: the route those failures opened stays open
// in Redis and on every replica. Before, the queued override was replayed
// after the failures, and ran a second time when Redis had applied it:
// the route closed again for the whole fleet (the flake of
// TestRedisThatWentBackIsHealed on a loaded CI machine).
func TestATimedOutOverrideKeepsItsPlace(t *testing.T) {
	cases := []struct {
		name  string
		fault func(px *redistest.Proxy, on bool)
	}{
		{"its answer late", func(px *redistest.Proxy, on bool) {
			if on {
				px.Latency(0, 300*time.Millisecond)
			} else {
				px.Latency(0, 0)
			}
		}},
		{"the call lost", func(px *redistest.Proxy, on bool) { px.Blackhole(on) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			px, a, b, clk := openOnTwo(t, "ovrq:")
			ctx := context.Background()
			now := func() int64 { return clk.Now().UnixNano() }
			for range 3 { // a warm connection: the call is sent at once
				if _, err := a.st.Status(ctx, a.key, now()); err != nil {
					t.Fatal(err)
				}
			}
			tc.fault(px, true)
			if err := a.st.ForceClose(ctx, a.key, now()); err != nil {
				t.Fatal(err)
			}
			eventually(t, "a degraded", a.st.Degraded)
			if !a.st.Peek(ctx, a.key, now()).Allowed {
				t.Fatal("the force-close did not reach a's view")
			}
			// The route fails again after the operator's close, in the same
			// millisecond: it opens on a's view.
			recordFail(t, a, clk)
			if a.st.Peek(ctx, a.key, now()).Allowed {
				t.Fatal("the failure did not open a's view")
			}
			tc.fault(px, false)
			eventually(t, "a back on Redis", func() bool { return !a.st.Degraded() })
			st, err := b.st.Status(ctx, b.key, now())
			if err != nil || st.State != "open" {
				t.Fatalf("Redis after the write-back: %+v %v, want open", st, err)
			}
			eventually(t, "open on a's view", func() bool { return !a.st.Peek(ctx, a.key, now()).Allowed })
		})
	}
}
