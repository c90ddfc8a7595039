package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// aheadClock is a wall clock that runs d ahead.
type aheadClock struct{ d time.Duration }

func (c aheadClock) Now() time.Time { return time.Now().Add(c.d) }

// TestSkewedReplicaKeepsTheProbeBound (R-ST9, R-ST16): a replica whose
// clock runs 6 s ahead (longer than the 5 s probe timeout) cannot take a
// second probe slot while the first one's probe is in flight: leases expire
// on Redis's clock. Production time here (no TestClock): Redis's TIME
// decides, so the test waits for a real 100 ms cooldown (there is no fake
// clock for Redis). Before R-ST9 the scripts used each caller's clock, the
// lease looked expired to the skewed replica, and 2 probes were admitted
// with half_open_max_probes 1.
func TestSkewedReplicaKeepsTheProbeBound(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clocks := []breaker.Clock{breaker.SystemClock{}, aheadClock{6 * time.Second}}
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs, p.HalfOpenMaxProbes, p.ProbeTimeoutMs = 1, 100, 1, 5000
	})
	rs := replicasWith(t, client, "skew:", clocks[0], p, 2, time.Second, func(i int, o *redisstore.Options) {
		o.Clock, o.TestClock = clocks[i], false
	})
	ctx := context.Background()
	now := func(i int) int64 { return clocks[i].Now().UnixNano() }
	adm, _, _ := rs[0].st.Acquire(ctx, rs[0].key, now(0), false)
	if _, err := rs[0].st.Record(ctx, rs[0].key, now(0), adm, fail503); err != nil {
		t.Fatal(err)
	}
	eventually(t, "open in Redis", func() bool {
		st, err := rs[0].st.Status(ctx, rs[0].key, now(0))
		return err == nil && st.State == "open"
	})
	// The skewed replica's view has learned of the open (a closed view
	// would admit on its own, by design, without asking Redis).
	eventually(t, "the skewed replica sees the open", func() bool {
		return rs[1].st.Peek(ctx, rs[1].key, now(1)).State != breaker.Closed
	})
	eventually(t, "the first probe, once Redis's cooldown elapsed", func() bool {
		_, ok, err := rs[0].st.Acquire(ctx, rs[0].key, now(0), false)
		return ok && err == nil
	})
	if _, ok, _ := rs[1].st.Acquire(ctx, rs[1].key, now(1), false); ok {
		st, _ := rs[1].st.Status(ctx, rs[1].key, now(1))
		t.Fatalf("the skewed replica took a second probe slot (half_open_max_probes 1): %+v", st)
	}
}
