package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestSlowRedisLosesNoOutcome (R-ST8): with 2 ms, then 5 ms, added per
// direction (a slow network), a burst of 10,000 failures on one breaker
// all reach Redis: each worker sends what is queued in one pipelined round
// trip, and a full queue overflows behind itself instead of dropping to
// the local view. Before, 5,903 of 10,000 never reached Redis at 2 ms.
func TestSlowRedisLosesNoOutcome(t *testing.T) {
	if testing.Short() {
		t.Skip("a burst through a slow proxy")
	}
	for _, perDir := range []time.Duration{2 * time.Millisecond, 5 * time.Millisecond} {
		t.Run(perDir.String()+" per direction", func(t *testing.T) {
			srv := redistest.Start(t)
			px := srv.Proxy(t)
			px.Latency(perDir, perDir)
			client, err := redisstore.NewClient("redis://" + px.Addr + "/0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { client.Close() })
			clk := breaker.NewFakeClock(time.Now())
			p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1000000 })
			r := replicasWith(t, client, "slow:", clk, p, 1, time.Second, nil)[0]
			ctx := context.Background()
			const n = 10000
			t0 := time.Now()
			for i := 0; i < n; i++ {
				adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
				if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, fail503); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(60 * time.Second)
			for {
				s, err := r.st.Status(ctx, r.key, clk.Now().UnixNano())
				if err == nil && s.Failures == n {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d failures reached Redis (err %v)", s.Failures, n, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			el := time.Since(t0)
			// The figure for the note: records per second per breaker
			// against one round trip per record (1/RTT).
			rtt := 2 * perDir
			perRTT := float64(time.Second) / float64(rtt)
			t.Logf("%d of %d records reached Redis through %s per direction in %s: %.0f/s, %.1fx 1/RTT (%.0f/s)",
				n, n, perDir, el, float64(n)/el.Seconds(), float64(n)/el.Seconds()/perRTT, perRTT)
			if r.errCount("record_queue_full") != 0 {
				t.Fatalf("%d records dropped to the local view", r.errCount("record_queue_full"))
			}
		})
	}
}

// TestFeedSurvivesItsConnectionCut: the pub/sub connection cut alone (the
// command connections untouched) is resubscribed, the replica resyncs, and
// transitions reach it again.
func TestFeedSurvivesItsConnectionCut(t *testing.T) {
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	c1, err := redisstore.NewClient("redis://" + px.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c1.Close() })
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 })
	r0 := replicas(t, srv.Client(t), "cut:", clk, p, 1, time.Second)[0]
	r1 := replicasWith(t, c1, "cut:", clk, p, 1, time.Second, func(_ int, o *redisstore.Options) {
		o.ReplicaID, o.RefreshInterval = "r-cut", time.Hour // only the feed can tell it
	})[0]
	subscribed(t, srv.Client(t), "cut:feed", 2)
	px.CutPubSub()
	subscribed(t, srv.Client(t), "cut:feed", 2) // go-redis resubscribed
	ctx := context.Background()
	adm, _, _ := r0.st.Acquire(ctx, r0.key, clk.Now().UnixNano(), false)
	if _, err := r0.st.Record(ctx, r0.key, clk.Now().UnixNano(), adm, fail503); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the open reaches the replica whose feed was cut", func() bool {
		return !r1.st.Peek(ctx, r1.key, clk.Now().UnixNano()).Allowed
	})
}
