package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/breaker/storetest"
)

// The Redis store keeps the same contract as the memory store, against a
// real redis-server.
func TestRedisStoreContract(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, onEvent func(breaker.Event)) breaker.Store {
		return redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: fmt.Sprintf("t%d:", n.Add(1)),
			OpTimeout: 2 * time.Second, OnEvent: onEvent})
	})
}

// Scripts are called by SHA and reloaded when Redis has lost them
// (NOSCRIPT after a restart or SCRIPT FLUSH); every call has a deadline.
func TestScriptReloadAndDeadline(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	p := breaker.DefaultPolicy()
	p.Enabled = true
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "r:", OpTimeout: 200 * time.Millisecond})
	now := time.Now().UnixNano()
	keys, _, _ := st.Install(ctx, now, []breaker.Spec{{ID: breaker.RouteID("g", "p:r:m"), Policy: p.Finish()}})
	if _, err := st.Status(ctx, keys[0], now); err != nil {
		t.Fatal(err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Status(ctx, keys[0], now); err != nil {
		t.Fatalf("after SCRIPT FLUSH: %v", err)
	}
	// Keys carry the breaker's hash tag: one Cluster slot per breaker.
	if k := st.Key(breaker.RouteID("g", "p:r:m")); !strings.Contains(k, "{g|p:r:m}") {
		t.Fatalf("key %q", k)
	}
	// Redis gone: the call fails within the deadline, never hangs, and a
	// decision still answers from the local view.
	srv.Stop()
	start := time.Now()
	if _, err := st.Record(ctx, keys[0], now, breaker.Admission{Gen: 1}, breaker.Result{Kind: breaker.KindStatus, Status: 500}); err == nil {
		t.Fatal("a record with Redis down reported success")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the call took %v with a 200 ms deadline", d)
	}
	if v := st.Peek(ctx, keys[0], now); !v.Allowed {
		t.Fatalf("peek with Redis down: %+v", v)
	}
	if _, ok, _ := st.Acquire(ctx, keys[0], now, false); !ok {
		t.Fatal("acquire with Redis down refused a closed route")
	}
}
