package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
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
	record(rs[2], breaker.Result{Kind: breaker.KindAnswered, Status: 200, Unsaturate: true})
	for i, r := range rs {
		eventually(t, fmt.Sprintf("replica %d sees it end", i), func() bool { return !r.st.Peek(ctx, r.key, now()).Saturated })
	}
}
