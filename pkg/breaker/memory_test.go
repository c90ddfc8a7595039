package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/storetest"
)

// The memory store keeps the Store contract.
func TestMemoryStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, onEvent func(breaker.Event)) breaker.Store {
		return breaker.NewMemory(onEvent)
	})
}

// RunSweeper makes a due transition without any read of the breaker.
func TestRunSweeper(t *testing.T) {
	clk := breaker.NewFakeClock(time.Unix(1_800_000_000, 0))
	got := make(chan breaker.Event, 8)
	st := breaker.NewMemory(func(e breaker.Event) { got <- e })
	p := breaker.DefaultPolicy()
	p.Enabled, p.ConsecutiveFailures, p.CooldownMs = true, 1, 1000
	keys, _, _ := st.Install(context.Background(), clk.Now().UnixNano(), []breaker.Spec{{ID: breaker.RouteID("g", "p:r:m"), Policy: p.Finish()}})
	adm, _, _ := st.Acquire(context.Background(), keys[0], clk.Now().UnixNano(), false)
	_, _ = st.Record(context.Background(), keys[0], clk.Now().UnixNano(), adm, breaker.Result{Kind: breaker.KindConnError})
	if e := <-got; e.Transition() != "closed->open" {
		t.Fatalf("event %v", e.Transition())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go breaker.RunSweeper(ctx, st, clk, time.Millisecond, nil)
	clk.Advance(time.Second) // the cooldown, on the fake clock
	select {
	case e := <-got:
		if e.Transition() != "open->half_open" {
			t.Fatalf("event %v", e.Transition())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sweeper made no transition")
	}
}
