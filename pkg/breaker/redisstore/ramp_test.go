package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// R-D8 across a fleet: the ramp runs from the close Redis holds, so a
// replica that learns of the close later (through the feed) has the same
// share at the same time as the replica whose probe closed the breaker.
func TestReplicasRampTogether(t *testing.T) {
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs = 1, 1000
		p.RecoveryRampSec, p.RecoveryRampStartPercent = 60, 10
	})
	rs := replicas(t, srv.Client(t), "ramp:", clk, p, 2, time.Second)
	a, b := rs[0], rs[1]
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	adm, _, _ := a.st.Acquire(ctx, a.key, now(), false)
	if _, err := a.st.Record(ctx, a.key, now(), adm, fail503); err != nil {
		t.Fatal(err)
	}
	eventually(t, "open in Redis (records are queued)", func() bool {
		st, err := a.st.Status(ctx, a.key, now())
		return err == nil && st.State == "open"
	})
	clk.Advance(2 * time.Second)
	adm, ok, _ := a.st.Acquire(ctx, a.key, now(), false)
	if !ok || adm.Lease == 0 {
		t.Fatalf("no probe slot: %+v %v", adm, ok)
	}
	if _, err := a.st.Record(ctx, a.key, now(), adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the close reaches the other replica", func() bool {
		return b.st.Peek(ctx, b.key, now()).RampPermille > 0
	})
	// The other replica learned late: 20 s on, both say the same share.
	clk.Advance(20 * time.Second)
	va, vb := a.st.Peek(ctx, a.key, now()), b.st.Peek(ctx, b.key, now())
	if va.RampPermille != 400 || vb.RampPermille != va.RampPermille {
		t.Fatalf("shares at +20 s: %d and %d, want 400 on both", va.RampPermille, vb.RampPermille)
	}
}
