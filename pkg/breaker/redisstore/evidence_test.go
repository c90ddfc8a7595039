package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestOwnEvidenceFirst (R-ST6): with Redis paused, this replica's own
// tripping failure (threshold 1) changes its very next decision: the route
// is refused at once, and still 500 ms later. Before, records waited in
// the queue and the view learned of them only from Redis's answer.
func TestOwnEvidenceFirst(t *testing.T) {
	// 50 ms: the paused Redis's calls give up well inside the pause.
	srv, r, clk := thresholdOne(t, "own:", 50*time.Millisecond)
	ctx := context.Background()
	srv.Pause(t, 2*time.Second, "ALL")
	failOnce(t, r, clk)
	for _, after := range []time.Duration{0, 500 * time.Millisecond} {
		time.Sleep(after)
		if r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed {
			t.Fatalf("%s after its own tripping failure, the replica still chose the route", after)
		}
	}
}

// TestVanishedKeysHeal (R-ST8): after FLUSHALL (or an expiry, an eviction,
// a failover to a lagging replica) a breaker's next failures open it again
// on every replica. Before, the views' sequences were newer than Redis's
// fresh ones, so every state was dropped and the route stayed closed.
func TestVanishedKeysHeal(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, client, "gone:", clk, replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 }), 2, time.Second)
	ctx := context.Background()
	trip := func() { recordFail(t, rs[0], clk) }
	episode(t, rs, clk, 3) // several changes: the views' sequences grow past a fresh key's
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	trip()
	for i, r := range rs {
		eventually(t, "the failure after FLUSHALL opens the breaker", func() bool {
			return !r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed
		})
		_ = i
	}
}

// TestEvictedKeysHeal (R-ST8): with maxmemory and allkeys-lru, a breaker's
// key evicted under memory pressure comes back as a fresh incarnation, and
// the next failure opens the breaker on every replica.
func TestEvictedKeysHeal(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	ctx := context.Background()
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, client, "evict:", clk, replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 }), 2, time.Second)
	trip := func() {
		adm, _, _ := rs[0].st.Acquire(ctx, rs[0].key, clk.Now().UnixNano(), false)
		if _, err := rs[0].st.Record(ctx, rs[0].key, clk.Now().UnixNano(), adm, fail503); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ { // the views' sequences grow past a fresh key's
		trip()
		eventuallyOpen(t, "open in Redis", rs[1], clk)
		if err := rs[0].st.Reset(ctx, rs[0].key, clk.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			eventually(t, "closed", func() bool { return r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed })
		}
	}
	stateKey := rs[0].st.Key(replicaID)
	if err := client.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigSet(ctx, "maxmemory", "4mb").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.ConfigSet(context.Background(), "maxmemory", "0") })
	junk := make([]byte, 64<<10)
	for i := 0; ; i++ {
		if n, _ := client.Exists(ctx, stateKey).Result(); n == 0 {
			break
		}
		if i > 2000 {
			t.Fatal("the breaker's key was never evicted")
		}
		_ = client.Set(ctx, fmt.Sprintf("junk:%d", i), junk, 0).Err()
	}
	if err := client.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	trip()
	for _, r := range rs {
		eventually(t, "the failure after the eviction opens the breaker", func() bool {
			return !r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed
		})
	}
}

// TestTransitionsNameTheirDecider: the transition a script made carries
// decided_by=redis (every replica's), the one this replica's local view
// made while Redis was unreachable decided_by=local (its own alone). The
// fleet soak checks each kind of chain on its own; an operator reading a
// fleet's logs can tell them apart.
func TestTransitionsNameTheirDecider(t *testing.T) {
	// 2 s, a hang bound: the store's calls must reach the running Redis
	// however loaded the machine (at 50 ms a loaded CI run's refresh
	// timed out, the store went degraded, and both transitions were
	// decided locally, #54); once Redis is stopped they are refused at
	// once.
	srv, r, clk := thresholdOne(t, "decider:", 2*time.Second)
	ctx := context.Background()
	failOnce(t, r, clk)
	eventually(t, "the shared open reported", func() bool { return len(r.transitions()) == 1 })
	if err := r.st.ForceClose(ctx, r.key, clk.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	eventually(t, "degraded", func() bool { return r.st.Degraded() })
	failOnce(t, r, clk)
	eventually(t, "the local open reported", func() bool { return len(r.transitions()) == 3 })
	r.mu.Lock()
	defer r.mu.Unlock()
	want := []string{"closed->open " + breaker.DecidedByRedis, "open->closed " + breaker.DecidedByRedis, "closed->open " + breaker.DecidedByLocal}
	for i, e := range r.events {
		if got := e.Transition() + " " + e.DecidedBy; got != want[i] {
			t.Errorf("transition %d: %q, want %q", i, got, want[i])
		}
	}
}

// thresholdOne starts one replica whose breaker opens on one failure, its
// store calls bounded by opTimeout.
func thresholdOne(t *testing.T, prefix string, opTimeout time.Duration) (*redistest.Server, *replica, *breaker.FakeClock) {
	t.Helper()
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	r := replicasWith(t, storeClient(t, srv), prefix, clk, replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 }), 1, opTimeout, nil)[0]
	return srv, r, clk
}

// failOnce admits one request on r's route and records a 503 for it.
func failOnce(t *testing.T, r *replica, clk *breaker.FakeClock) {
	t.Helper()
	ctx := context.Background()
	adm, ok, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
	if !ok {
		t.Fatal("a healthy route was refused")
	}
	if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, fail503); err != nil {
		t.Fatal(err)
	}
}

// TestARecordAdmittedBeforeAFlushStillTrips (#49, R-ST8): a request is
// admitted under the breaker's generation, Redis is emptied, another call
// makes the breaker's state again (at generation 1) before the request's
// outcome is recorded. Before, the record was stale under the fresh
// state's generation: its key was taken, its failure counted nowhere, and
// the route stayed closed (the flush case measured from outside, 5 of 20
// runs). A generation later than the stored one says the state was lost:
// the record counts under its own.
func TestARecordAdmittedBeforeAFlushStillTrips(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, client, "flushrec:", clk, replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 }), 2, time.Second)
	ctx := context.Background()
	episode(t, rs, clk, 2) // the generation grows past a fresh state's
	adm, _, _ := rs[0].st.Acquire(ctx, rs[0].key, clk.Now().UnixNano(), false)
	if adm.Gen <= 1 {
		t.Fatalf("admitted at generation %d, want past 1", adm.Gen)
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Another call makes the state again, at generation 1.
	if _, err := rs[1].st.Status(ctx, rs[1].key, clk.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	res := fail503
	res.Key = "d-flush:1"
	if _, err := rs[0].st.Record(ctx, rs[0].key, clk.Now().UnixNano(), adm, res); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		eventuallyOpen(t, "the failure admitted before FLUSHALL opens the breaker", r, clk)
	}
}

// TestALaterGenerationCountsWhileClosed (#54, R-S6, R-ST8): after FLUSHALL
// a record admitted under an older generation makes the state again and
// counts (the rule above), and then a failure admitted under a later
// generation comes: the replica's view had run on through an episode
// Redis never saw again (its answers lost while Redis did not answer it,
// or the flush took them). Only an outcome from an earlier generation is
// stale (R-S6); a later one, while the breaker is closed, is a closed
// route's outcome and counts. Before, the script called any other
// generation stale: the failure was applied, counted nowhere, and the
// route stayed closed on every replica (the e2e FLUSHALL scenario lost a
// trip so on a loaded machine: Redis closed at generation 3, the failure
// admitted at 4).
func TestALaterGenerationCountsWhileClosed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, client, "latergen:", clk, replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 }), 2, time.Second)
	ctx := context.Background()
	episode(t, rs, clk, 1)
	early, _, _ := rs[0].st.Acquire(ctx, rs[0].key, clk.Now().UnixNano(), false) // a long request
	episode(t, rs, clk, 1)
	late, _, _ := rs[0].st.Acquire(ctx, rs[0].key, clk.Now().UnixNano(), false)
	if early.Gen <= 1 || late.Gen <= early.Gen {
		t.Fatalf("admitted at generations %d and %d, want 1 < early < late", early.Gen, late.Gen)
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ok := breaker.Result{Kind: breaker.KindAnswered, Status: 200, Key: "d-early:1"}
	if _, err := rs[0].st.Record(ctx, rs[0].key, clk.Now().UnixNano(), early, ok); err != nil {
		t.Fatal(err)
	}
	failed := fail503
	failed.Key = "d-late:1"
	if _, err := rs[0].st.Record(ctx, rs[0].key, clk.Now().UnixNano(), late, failed); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		eventuallyOpen(t, "the failure admitted under the later generation opens the breaker", r, clk)
	}
}
