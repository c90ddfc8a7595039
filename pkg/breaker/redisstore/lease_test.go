package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestTimedOutAcquireFreesItsSlot (#36): a probe's acq that times out on
// the replica but ran in Redis took the half-open slot there. The replica
// chose the lease's id, so it releases that slot when Redis answers again,
// before its resync. Before, Redis gave the id, the replica never learned
// it, and with half_open_max_probes 1 the route took no probe at all until
// probe_timeout_ms (here never: the test's clock stands still).
func TestTimedOutAcquireFreesItsSlot(t *testing.T) {
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs, p.HalfOpenMaxProbes, p.ProbeTimeoutMs = 1, 1000, 1, 60000
	})
	a := replicasWith(t, proxiedClient(t, px), "lease:", clk, p, 1, 100*time.Millisecond, nil)[0]
	b := replicasWith(t, srv.Client(t), "lease:", clk, p, 1, time.Second, func(_ int, o *redisstore.Options) {
		o.ReplicaID = "b"
	})[0]
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	recordFail(t, a, clk)
	eventually(t, "open in Redis", func() bool {
		s, err := b.st.Status(ctx, b.key, now())
		return err == nil && s.State == "open"
	})
	clk.Advance(time.Second)
	// A warm connection, so that the acq itself is sent at once (a new one
	// would wait for its handshake's delayed answer and send nothing).
	for range 3 {
		if _, err := a.st.Status(ctx, a.key, now()); err != nil {
			t.Fatal(err)
		}
	}
	px.Latency(0, 300*time.Millisecond) // the answer comes after the replica gave up
	if _, _, err := a.st.Acquire(ctx, a.key, now(), false); err == nil {
		t.Fatal("the acq did not time out")
	}
	if s, _ := b.st.Status(ctx, b.key, now()); s.State != "half_open" || s.ProbesInFlight != 1 {
		t.Fatalf("the timed-out acq did not take the slot in Redis: %+v", s)
	}
	px.Latency(0, 0)
	eventually(t, "the slot freed", func() bool {
		s, err := b.st.Status(ctx, b.key, now())
		return err == nil && s.ProbesInFlight == 0
	})
	if _, ok, err := b.st.Acquire(ctx, b.key, now(), false); !ok || err != nil {
		t.Fatalf("another replica's probe was refused: %v", err)
	}
}
