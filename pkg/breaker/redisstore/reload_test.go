package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestAReloadKeepsWhatRedisHasNotTaken (#54, R-ST4): a replica records two
// failures while Redis does not answer, its configuration is reloaded (the
// same file again, or a changed policy), and Redis comes back. The two
// failures are written back: another replica reads them in Redis. Before,
// Install built a new entry for every breaker, kept ones too, and the
// outcomes the old entry owed Redis were left behind with it: the other
// replica read 0 failures.
func TestAReloadKeepsWhatRedisHasNotTaken(t *testing.T) {
	for _, c := range []struct {
		name      string
		threshold int
	}{
		{"the same configuration again", 3},
		{"a changed policy", 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			px := srv.Proxy(t)
			clk := breaker.NewFakeClock(time.Now())
			p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 3 })
			r := replicasWith(t, proxiedClient(t, px), "reload:", clk, p, 1, 100*time.Millisecond, nil)[0]
			judge := replicas(t, storeClient(t, srv), "reload:", clk, p, 1, 2*time.Second)[0]
			ctx := context.Background()

			px.Blackhole(true)
			recordFail(t, r, clk)
			recordFail(t, r, clk)
			eventually(t, "degraded", r.st.Degraded)
			np := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = c.threshold })
			if _, _, err := r.st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: np}}); err != nil {
				t.Fatal(err)
			}
			px.Blackhole(false)
			eventually(t, "reachable again and written back", func() bool {
				r.st.Refresh(ctx)
				return !r.st.Degraded()
			})
			st, err := judge.st.Status(ctx, judge.key, clk.Now().UnixNano())
			if err != nil {
				t.Fatal(err)
			}
			if st.Failures != 2 {
				t.Fatalf("Redis holds %d failures after the write-back, want the 2 recorded while it was away", st.Failures)
			}
			if st, _ := r.st.Status(ctx, r.key, clk.Now().UnixNano()); st.PolicyVersion != np.Version {
				t.Fatalf("the reloaded replica reports policy %s, want the reloaded %s", st.PolicyVersion, np.Version)
			}
		})
	}
}

// TestAReloadKeepsABreakerOnItsLocalState (#54, R-L12): Redis answers one
// breaker's calls with an error reply, the breaker opens on its local
// state alone, the configuration is reloaded, and the key reads again. The
// local open is written back: another replica reads the breaker open.
// Before, the reload's new entry forgot that the breaker was on its local
// state: its next call went to Redis as if nothing had happened, the open
// was never written back (the other replica read it closed), and the
// breaker's "reads again" line, which ends its local chain of transitions
// in the fleet soak, was never written.
func TestAReloadKeepsABreakerOnItsLocalState(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	ctx := context.Background()
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 2 })
	specs := []breaker.Spec{{ID: replicaID, Policy: p}}
	st, keys, hook := keyErrorStore(t, client, "kreload:", clk, specs)
	judge := replicas(t, storeClient(t, srv), "kreload:", clk, p, 1, 2*time.Second)[0]

	hook.on.Store(true)
	for range 2 {
		adm, _, _ := st.Acquire(ctx, keys[0], clk.Now().UnixNano(), false)
		_, _ = st.Record(ctx, keys[0], clk.Now().UnixNano(), adm, fail503)
	}
	if st.Peek(ctx, keys[0], clk.Now().UnixNano()).Allowed {
		t.Fatal("the breaker whose key fails did not open on its own evidence")
	}
	if _, _, err := st.Install(ctx, clk.Now().UnixNano(), specs); err != nil {
		t.Fatal(err)
	}
	hook.on.Store(false)
	eventually(t, "the local open reaches Redis", func() bool {
		s, err := judge.st.Status(ctx, judge.key, clk.Now().UnixNano())
		return err == nil && s.State == "open"
	})
}
