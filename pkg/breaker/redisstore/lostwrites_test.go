package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// Redis goes back (R-ST8): a failover promotes a replica that lacked the
// last writes (Redis replication is asynchronous), played here by putting
// back the keys as they were before the open (DUMP, then RESTORE REPLACE:
// the same incarnation, an older sequence, an older change counter). The
// replicas' views had the open; the refresh writes it back to Redis, and
// the views follow Redis again afterwards. Before, the open was lost in
// Redis, and each view ignored every later change of the breaker until
// Redis's sequence passed the view's again (fails before: the forced close
// below never reaches the other replica's view).
func TestRedisThatWentBackIsHealed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	ctx := context.Background()
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 3 })
	rs := replicasWith(t, client, "back:", clk, p, 2, time.Second, func(_ int, o *redisstore.Options) {
		o.RefreshInterval = 20 * time.Millisecond
	})
	a, b := rs[0], rs[1]
	rec := func(r *replica, res breaker.Result) {
		adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
		_, _ = r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, res)
	}
	rec(a, breaker.Result{Kind: breaker.KindAnswered, Status: 200})
	rec(a, fail503)
	eventually(t, "the key exists", func() bool { n, _ := client.Exists(ctx, a.st.Key(replicaID)).Result(); return n == 1 })
	time.Sleep(50 * time.Millisecond)
	// What the lagging replica holds: the state before the open.
	keys := []string{a.st.Key(replicaID), "back:{changes}:meta", "back:{changes}:log"}
	dumps := map[string]string{}
	for _, k := range keys {
		if d, err := client.Dump(ctx, k).Result(); err == nil {
			dumps[k] = d
		}
	}
	// The writes the lagging replica lacks: the breaker opens, an
	// operator closes it, it opens again, ... (its sequence moves well
	// past the one restored below).
	for range 5 {
		_ = a.st.ForceClose(ctx, a.key, clk.Now().UnixNano())
		for range 3 {
			rec(a, fail503)
		}
	}
	for _, r := range rs {
		eventually(t, "open on both", func() bool { return !r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed })
	}
	// The failover: Redis goes back.
	for _, k := range keys {
		if d, ok := dumps[k]; ok {
			if err := client.RestoreReplace(ctx, k, 0, d).Err(); err != nil {
				t.Fatal(err)
			}
		} else {
			client.Del(ctx, k)
		}
	}
	eventually(t, "the open written back to Redis", func() bool {
		st, err := b.st.Status(ctx, b.key, clk.Now().UnixNano())
		return err == nil && st.State == "open"
	})
	// The views follow Redis again: an operator's close on one replica
	// reaches the other's view.
	if err := a.st.ForceClose(ctx, a.key, clk.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the close reaches the other replica", func() bool { return b.st.Peek(ctx, b.key, clk.Now().UnixNano()).Allowed })
}
