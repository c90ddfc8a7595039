package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// TestLateAnswerWaitsForTheResync (#37, the fleet soak's "open->half_open
// after half_open" on a replica's local chain): while the store is
// degraded, an answer that arrives late does not move the local view,
// which only its own transitions move until the resync reads the breaker
// back. An operator's override still applies. Before, the late answer
// restored Redis's state silently between two local transitions.
func TestLateAnswerWaitsForTheResync(t *testing.T) {
	st := New(Options{Client: nil, KeyPrefix: "late:", TestClock: true, Clock: breaker.NewFakeClock(time.Now())})
	p := breaker.DefaultPolicy()
	p.Enabled = true
	id := breaker.RouteID("gw", "a:r:m")
	now := time.Now().UnixNano()
	keys, _, err := st.Install(context.Background(), now, []breaker.Spec{{ID: id, Policy: p.Finish()}})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := st.get(keys[0])
	open := breaker.Snapshot{State: breaker.Open, Generation: 5, Reason: "provider_5xx", OpenedAt: now, OpenUntil: now + int64(time.Minute)}
	state := func() breaker.State { return st.Peek(context.Background(), keys[0], now).State }
	st.sync.step(callFailed)
	st.apply(e, "inc", 3, open, answer{kind: answerRead})
	if s := state(); s != breaker.Closed {
		t.Fatalf("a late answer moved the degraded local view to %v", s)
	}
	st.apply(e, "inc", 4, open, answer{kind: answerOverride})
	if s := state(); s == breaker.Closed {
		t.Fatal("an override's answer did not apply")
	}
	st.sync.p.Store(int32(synced))
}
