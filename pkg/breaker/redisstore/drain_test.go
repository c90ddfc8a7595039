package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestQueuedRecordsDrainedAtStop (R-ST8): records still queued when the
// store stops are written before Start's goroutines end. Before, the
// workers returned at once and the queue was dropped.
func TestQueuedRecordsDrainedAtStop(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	ctx := context.Background()
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1000 })
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "drain:", OpTimeout: 2 * time.Second, Clock: clk,
		AsyncRecord: true, RefreshInterval: time.Hour})
	keys, _, err := st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	wg := st.Start(runCtx)
	eventually(t, "ready", st.Ready)
	// Redis pauses: the records queue up behind the first one.
	srv.Pause(t, 300*time.Millisecond, "WRITE")
	for i := 0; i < 50; i++ {
		adm, _, _ := st.Acquire(ctx, keys[0], clk.Now().UnixNano(), false)
		if _, err := st.Record(ctx, keys[0], clk.Now().UnixNano(), adm, fail503); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	check := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "drain:", OpTimeout: time.Second, Clock: clk})
	ck, _, _ := check.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	s, err := check.Status(ctx, ck[0], clk.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	if s.Failures != 50 {
		t.Fatalf("%d of 50 queued failures reached Redis", s.Failures)
	}
}
