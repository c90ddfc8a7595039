package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// TestStalledRedisNeverHoldsADecision (R-ST7): with Redis connected but
// paused (CLIENT PAUSE, as during a fork or a failover), a decision that
// needs Redis (a half-open probe slot) returns within op_timeout_ms, on
// the local view. Before, go-redis ignored the deadline at the socket and
// the decision waited for the whole pause (2.5 s in the probe).
func TestStalledRedisNeverHoldsADecision(t *testing.T) {
	srv := redistest.Start(t)
	client := storeClient(t, srv)
	waits := &decisionWaits{opTimeout: 50 * time.Millisecond}
	client.AddHook(waits)
	clk := breaker.NewFakeClock(time.Now())
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "stall:", OpTimeout: 50 * time.Millisecond, Clock: clk})
	ctx := context.Background()
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 })
	keys, _, err := st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	if err != nil {
		t.Fatal(err)
	}
	k := keys[0]
	adm, _, _ := st.Acquire(ctx, k, clk.Now().UnixNano(), false)
	if _, err := st.Record(ctx, k, clk.Now().UnixNano(), adm, fail503); err != nil {
		t.Fatal(err)
	}
	clk.Advance(11 * time.Second) // past the cooldown: half-open, a probe slot is a script call
	// Judged by the deadline the decision's script call ran under (the
	// decisionWaits hook), and by an end before the pause's (4 s): a
	// bound of 500 ms on the wall clock was a loaded machine's to break.
	const pause = 4 * time.Second
	srv.Pause(t, pause, "ALL")
	t0 := time.Now()
	dctx, dw := waits.decision(ctx)
	_, _, _ = st.Acquire(dctx, k, clk.Now().UnixNano(), false)
	el := time.Since(t0)
	waits.done(dw)
	if waits.waited.Load() != 1 {
		t.Fatalf("the half-open decision made no Redis call: the test proves nothing")
	}
	waits.check(t, el)
	if el >= pause {
		t.Fatalf("the decision took %v: it waited out Redis's pause", el)
	}
}

// storeClient is a client made as fusebox makes it (NewClient: deadlines
// at the socket), on srv.
func storeClient(t *testing.T, srv *redistest.Server) redis.UniversalClient {
	t.Helper()
	client, err := redisstore.NewClient("redis://" + srv.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}
