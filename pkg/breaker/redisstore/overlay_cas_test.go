package redisstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/routes/shared"
)

const casConfig = `
gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_threshold: 5, cooldown_ms: 30000}
    models:
      - {name: m, routes: ["a:r:m", "b:r:m"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "b:r:m", cluster: cb}
`

// managerOn is one replica's config manager on the Redis overlays, with
// no feed: it learns of other replicas' changes only when it reads.
func managerOn(t *testing.T, srv *redistest.Server) *routes.Manager {
	t.Helper()
	st := redisstore.New(redisstore.Options{TestClock: true, Client: srv.Client(t), KeyPrefix: "cas:", OpTimeout: time.Second, Clock: breaker.NewFakeClock(time.Now())})
	m := &routes.Manager{Store: &shared.Overlays{Backend: &redisstore.Overlays{Store: st}}, SharedStore: true}
	rt, err := m.Open(context.Background(), []byte(casConfig))
	if err != nil {
		t.Fatal(err)
	}
	m.Holder = routes.NewHolder(rt)
	return m
}

func policyField(t *testing.T, m *routes.Manager, field string) any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(m.Holder.Load().Gateways["default"].Doc, &doc); err != nil {
		t.Fatal(err)
	}
	cb, _ := doc["circuit_breaker"].(map[string]any)
	return cb[field]
}

// TestConcurrentChangesOnTwoReplicasBothKept (R-ST9): two replicas PATCH
// different fields of one gateway, the second from a document older than
// the first's change: both answer, and both changes are in force on both
// replicas and in Redis. Before, the second PATCH overwrote the first and
// one change vanished everywhere (5 of 5 rounds).
func TestConcurrentChangesOnTwoReplicasBothKept(t *testing.T) {
	srv := redistest.Start(t)
	a, b := managerOn(t, srv), managerOn(t, srv)
	ctx := context.Background()
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":8}}`)); err != nil {
		t.Fatal(err)
	}
	// b has not read a's change.
	if _, err := b.Patch(ctx, "default", []byte(`{"circuit_breaker":{"cooldown_ms":9000}}`)); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := managerOn(t, srv)
	for name, m := range map[string]*routes.Manager{"a": a, "b": b, "a new replica": fresh} {
		if th, cd := policyField(t, m, "failure_threshold"), policyField(t, m, "cooldown_ms"); th != float64(8) || cd != float64(9000) {
			t.Errorf("%s: failure_threshold %v, cooldown_ms %v: a change was lost", name, th, cd)
		}
	}
}

// TestEmptiedRedisGetsTheOverlaysBack (R-ST9): after FLUSHALL a running
// replica writes the admin changes in force back at its next overlay
// check, and a replica started after that runs with them. Before, the new
// replica ran without them.
func TestEmptiedRedisGetsTheOverlaysBack(t *testing.T) {
	srv := redistest.Start(t)
	a := managerOn(t, srv)
	ctx := context.Background()
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":8}}`)); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil { // the periodic check
		t.Fatal(err)
	}
	if th := policyField(t, managerOn(t, srv), "failure_threshold"); th != float64(8) {
		t.Fatalf("a replica started after FLUSHALL runs with failure_threshold %v", th)
	}
	// A gateway reverted by an operator is not written back: the store is
	// not empty then, its revision says the overlay was removed.
	if _, err := a.RevertOverlay(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if th := policyField(t, managerOn(t, srv), "failure_threshold"); th != float64(5) {
		t.Fatalf("a reverted overlay came back: failure_threshold %v, the file says 5", th)
	}
}

// TestOverlaysOfARedisThatWentBack (R-ST8): a failover promotes a replica
// that lacked the last admin change (played by restoring the overlays
// hash as it was before it). The replica that knew the change puts it back
// at its revision at its next overlay check, so no replica takes the older
// one. Before, the acknowledged change was lost: the replicas read the
// older revision and put it in force (fails before: failure_threshold 8).
func TestOverlaysOfARedisThatWentBack(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	a, b := managerOn(t, srv), managerOn(t, srv)
	ctx := context.Background()
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":8}}`)); err != nil {
		t.Fatal(err)
	}
	before, err := client.Dump(ctx, "cas:overlays").Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":9}}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// The failover: Redis holds the overlays as they were before the
	// second change.
	if err := client.RestoreReplace(ctx, "cas:overlays", 0, before).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil { // any replica that knew it
		t.Fatal(err)
	}
	for name, m := range map[string]*routes.Manager{"b": b, "a new replica": managerOn(t, srv)} {
		if th := policyField(t, m, "failure_threshold"); th != float64(9) {
			t.Errorf("%s runs with failure_threshold %v: the acknowledged change was lost", name, th)
		}
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if th := policyField(t, a, "failure_threshold"); th != float64(9) {
		t.Errorf("a runs with failure_threshold %v", th)
	}
	// A later change still wins over the restored one.
	if _, err := a.Patch(ctx, "default", []byte(`{"circuit_breaker":{"failure_threshold":10}}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if th := policyField(t, b, "failure_threshold"); th != float64(10) {
		t.Errorf("after a later change b runs with failure_threshold %v", th)
	}
}

// TestSaveEpochIsTheStoredOne: the lineage a save answers is the one a
// load reads, to the last digit. Before, the script answered it as a Lua
// number (a double): a 63-bit epoch came back rounded, unequal to the
// stored one, and a replica took its own next load for a Redis emptied and
// refilled (routes: relined).
func TestSaveEpochIsTheStoredOne(t *testing.T) {
	srv := redistest.Start(t)
	st := redisstore.New(redisstore.Options{TestClock: true, Client: srv.Client(t), KeyPrefix: "epoch:", OpTimeout: time.Second})
	o := &redisstore.Overlays{Store: st}
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		_, epoch, err := o.SaveIf(ctx, "default", []byte(`{}`), -1)
		if err != nil {
			t.Fatal(err)
		}
		_, revs, err := o.LoadRevisions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if revs[routes.EpochField] != epoch {
			t.Fatalf("save answered epoch %d, the store holds %d", epoch, revs[routes.EpochField])
		}
		srv.Client(t).FlushAll(ctx) // a fresh lineage next time
	}
}
