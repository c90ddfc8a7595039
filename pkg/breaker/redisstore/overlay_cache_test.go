package redisstore_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/routes/shared"
)

// managerCached is managerOn with a local overlay cache file (R-ST15).
func managerCached(t *testing.T, srv *redistest.Server, cache string) *routes.Manager {
	t.Helper()
	st := redisstore.New(redisstore.Options{TestClock: true, Client: srv.Client(t), KeyPrefix: "cas:", OpTimeout: time.Second, Clock: breaker.NewFakeClock(time.Now())})
	m := &routes.Manager{Store: &shared.Overlays{Backend: &redisstore.Overlays{Store: st}, Cache: cache,
		OnCacheError: func(err error) { t.Errorf("overlay cache: %v", err) }}, SharedStore: true}
	rt, err := m.Open(context.Background(), []byte(casConfig))
	if err != nil {
		t.Fatal(err)
	}
	m.Holder = routes.NewHolder(rt)
	return m
}

// TestAdminChangesSurviveRedisAndTheFleetRestarting (R-ST15): an
// acknowledged change, then Redis restarts empty (no persistence) and so
// does every replica: the first replica to start writes the change back
// from its cache file, and a replica without a cache runs with it too.
// Before, every acknowledged change was gone.
func TestAdminChangesSurviveRedisAndTheFleetRestarting(t *testing.T) {
	srv := redistest.Start(t)
	cache := filepath.Join(t.TempDir(), "fusebox", "overlays.json")
	ctx := context.Background()
	a := managerCached(t, srv, cache)
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":8}}`)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil { // Redis restarted empty
		t.Fatal(err)
	}
	restarted := managerCached(t, srv, cache) // a's process is new: only the file remembers
	if th := policyField(t, restarted, "failure_threshold"); th != float64(8) {
		t.Fatalf("after the restart: failure_threshold %v, want the acknowledged 8", th)
	}
	if th := policyField(t, managerOn(t, srv), "failure_threshold"); th != float64(8) {
		t.Fatalf("a replica with no cache: failure_threshold %v, want 8 (written back into Redis)", th)
	}
}

// TestRestoreNeverOverwritesANewerChange (R-ST15): a replica that knew
// revision 3 of a gateway finds Redis emptied, but a fresh replica changed
// that gateway meanwhile (revision 1 of the emptied store): the fresh
// change stands, on both, and in Redis. Before, the restore wrote revision
// 3 over it (its revision was higher) and the newer change was lost.
func TestRestoreNeverOverwritesANewerChange(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a := managerOn(t, srv)
	for _, th := range []int{6, 7, 8} {
		if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":`+itoa(th)+`}}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := managerOn(t, srv)
	if _, err := fresh.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":4}}`)); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil && err != routes.ErrStoreEmpty {
		t.Fatal(err)
	}
	if err := fresh.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*routes.Manager{"the old replica": a, "the fresh one": fresh, "a new one": managerOn(t, srv)} {
		if th := policyField(t, m, "failure_threshold"); th != float64(4) {
			t.Errorf("%s: failure_threshold %v, want the newer change's 4", name, th)
		}
	}
}

func itoa(n int) string {
	return string(rune('0' + n))
}

// TestAReplicaStartingOnAFlushedRedisMeetsTheFleetsChanges (#49, R-ST15):
// replica A runs with an acknowledged change; Redis is emptied (FLUSHALL);
// replica B starts with no cache file. B asks the running replicas, over
// the feed, to put back what they knew, and reads the store again until it
// holds it. Before, B ran on the file's settings until A's periodic read
// (up to 5 s): a fresh trip B judged at the file's threshold was lost (the
// flush case measured from outside, 1 run in 30).
func TestAReplicaStartingOnAFlushedRedisMeetsTheFleetsChanges(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var a *routes.Manager
	st := redisstore.New(redisstore.Options{TestClock: true, Client: srv.Client(t), KeyPrefix: "cas:", OpTimeout: time.Second,
		Clock: breaker.NewFakeClock(time.Now()), OnOverlay: func(string) {
			go func() { _ = a.Refresh(ctx) }()
		}})
	a = &routes.Manager{Store: &shared.Overlays{Backend: &redisstore.Overlays{Store: st}}, SharedStore: true}
	rt, err := a.Open(ctx, []byte(casConfig))
	if err != nil {
		t.Fatal(err)
	}
	a.Holder = routes.NewHolder(rt)
	wg := st.Start(ctx)
	defer func() { cancel(); wg.Wait() }()
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":8}}`)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// A listens on the feed (its subscription may take a moment).
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, _ := srv.Client(t).PubSubNumSub(ctx, "cas:feed").Result()
		if n["cas:feed"] > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if th := policyField(t, managerOn(t, srv), "failure_threshold"); th != float64(8) {
		t.Fatalf("a replica started on the flushed Redis: failure_threshold %v, want the acknowledged 8", th)
	}
}
