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
	srv.Pause(t, 1500*time.Millisecond, "ALL")
	t0 := time.Now()
	_, _, _ = st.Acquire(ctx, k, clk.Now().UnixNano(), false)
	if el := time.Since(t0); el > 500*time.Millisecond {
		t.Fatalf("a decision waited %s on a paused Redis (op_timeout 50 ms; the pause is 1.5 s)", el)
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
