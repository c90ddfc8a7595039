package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

var connRefused = breaker.Result{Kind: breaker.KindConnError}

// quorumFleet starts n replicas on one Redis with threshold 3, one probe,
// a 1 s cooldown and the given quorum, and waits until each counts n
// replicas alive.
func quorumFleet(t *testing.T, prefix string, n, quorum int, mod func(*breaker.Policy)) ([]*replica, *breaker.FakeClock) {
	t.Helper()
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs, p.HalfOpenMaxProbes, p.LocalOriginQuorum = 3, 1000, 1, quorum
		if mod != nil {
			mod(p)
		}
	})
	rs := replicasWith(t, srv.Client(t), prefix, clk, p, n, time.Second, nil)
	for _, r := range rs {
		eventually(t, "every replica counted alive", func() bool { return r.st.Alive() == n })
	}
	return rs, clk
}

func record(t *testing.T, r *replica, clk *breaker.FakeClock, res breaker.Result) {
	t.Helper()
	ctx := context.Background()
	adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
	if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, res); err != nil {
		t.Fatal(err)
	}
}

func sharedStatus(t *testing.T, r *replica, clk *breaker.FakeClock) breaker.Status {
	t.Helper()
	st, err := r.st.Status(context.Background(), r.key, clk.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLocalFailuresNeedAQuorum (R-FD2): one replica's connection failures
// open that replica alone (scope replica); the fleet's state in Redis
// counts none of them until a second replica sees such failures in the
// window; from then on they count for everyone. Upstream failures count
// at once, as before. Before, one pod's egress opened the provider for
// the whole fleet.
func TestLocalFailuresNeedAQuorum(t *testing.T) {
	rs, clk := quorumFleet(t, "quorum:", 2, 2, nil)
	a, b := rs[0], rs[1]
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	for range 3 {
		record(t, a, clk, connRefused)
	}
	v := a.st.Peek(ctx, a.key, now())
	if v.Allowed || !v.ReplicaScoped || v.State != breaker.Open {
		t.Fatalf("a's own egress view after 3 connection failures: %+v, want open, replica-scoped", v)
	}
	st := sharedStatus(t, a, clk)
	if st.ReplicaScope == nil || st.ReplicaScope.State != "open" || st.ReplicaScope.Replica != "r0" || !st.Notable {
		t.Fatalf("a's status: replica scope %+v, want open on r0", st.ReplicaScope)
	}
	if _, ok, _ := a.st.Acquire(ctx, a.key, now(), false); ok {
		t.Fatal("a admits a request to its replica-scoped open route")
	}
	// The fleet: closed, nothing counted; b routes as before.
	time.Sleep(50 * time.Millisecond) // a's queued records reach Redis
	if st := sharedStatus(t, b, clk); st.State != "closed" || st.Failures != 0 || st.ReplicaScope != nil {
		t.Fatalf("Redis after one replica's local failures: %s with %d failures (replica scope %+v)", st.State, st.Failures, st.ReplicaScope)
	}
	if v := b.st.Peek(ctx, b.key, now()); !v.Allowed {
		t.Fatalf("b refuses the route: %+v", v)
	}
	// A second replica sees local failures in the window: the quorum
	// holds, and they count for every replica.
	for range 3 {
		record(t, b, clk, connRefused)
	}
	eventually(t, "open in Redis after the quorum", func() bool { return sharedStatus(t, b, clk).State == "open" })
	eventually(t, "open on a's view of Redis", func() bool {
		v := a.st.Peek(ctx, a.key, now())
		return !v.Allowed && !v.ReplicaScoped
	})
	evs := a.transitions()
	if !slices.Contains(evs, "closed->open") {
		t.Fatalf("a's transitions %v lack its own closed->open", evs)
	}
	if n := countEvents([]*replica{a, b}, func(e breaker.Event) bool { return e.ReplicaScoped }); n == 0 {
		t.Fatal("no replica-scoped transition reported")
	}
	if n := countEvents([]*replica{b}, func(e breaker.Event) bool { return e.ReplicaScoped && e.Replica != "r1" }); n != 0 {
		t.Fatal("b reported another replica's scoped transition")
	}
}

// TestUpstreamFailuresCountAtOnce (R-FD2): the provider answered (a 503):
// the quorum is not asked, and no replica-scoped open is made.
func TestUpstreamFailuresCountAtOnce(t *testing.T) {
	rs, clk := quorumFleet(t, "quorumup:", 2, 2, nil)
	for range 3 {
		record(t, rs[0], clk, fail503)
	}
	eventually(t, "open in Redis", func() bool { return sharedStatus(t, rs[1], clk).State == "open" })
	if st := sharedStatus(t, rs[0], clk); st.ReplicaScope != nil {
		t.Fatalf("replica scope %+v after upstream failures", st.ReplicaScope)
	}
}

// TestQuorumCappedByReplicasAlive (R-FD2): a quorum of 1, or of more
// replicas than are alive, is the replicas alive: a fleet of one trips on
// its own evidence at once, as before, with no replica-scoped open.
func TestQuorumCappedByReplicasAlive(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n, quorum int
	}{{"quorum 1 of 2 replicas", 2, 1}, {"quorum 2 of 1 replica", 1, 2}, {"quorum 5 of 1 replica", 1, 5}} {
		t.Run(tc.name, func(t *testing.T) {
			rs, clk := quorumFleet(t, "quorumcap:", tc.n, tc.quorum, nil)
			for range 3 {
				record(t, rs[0], clk, connRefused)
			}
			eventually(t, "open in Redis", func() bool { return sharedStatus(t, rs[len(rs)-1], clk).State == "open" })
			if st := sharedStatus(t, rs[0], clk); st.ReplicaScope != nil {
				t.Fatalf("replica scope %+v", st.ReplicaScope)
			}
		})
	}
}

// TestAReplicaLeavingLowersTheQuorum (R-FD2): with quorum 2 and two
// replicas, one replica's local failures are held; once the other stops
// (it leaves the store's set of replicas), the one left is the whole
// fleet and its local failures count.
func TestAReplicaLeavingLowersTheQuorum(t *testing.T) {
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs, p.LocalOriginQuorum = 3, 1000, 2
	})
	a := replicasWith(t, srv.Client(t), "leave:", clk, p, 1, time.Second, nil)[0]
	// b runs until it stops.
	bctx, stop := context.WithCancel(context.Background())
	b := redisstore.New(redisstore.Options{TestClock: true, Client: srv.Client(t), KeyPrefix: "leave:", OpTimeout: time.Second,
		AsyncRecord: true, Clock: clk, RefreshInterval: 20 * time.Millisecond, ReplicaID: "b"})
	if _, _, err := b.Install(bctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}}); err != nil {
		t.Fatal(err)
	}
	wg := b.Start(bctx)
	eventually(t, "two alive", func() bool { return a.st.Alive() == 2 })
	record(t, a, clk, connRefused)
	time.Sleep(50 * time.Millisecond)
	if st := sharedStatus(t, a, clk); st.Failures != 0 {
		t.Fatalf("a local failure counted with b alive: %d", st.Failures)
	}
	stop()
	wg.Wait()
	eventually(t, "b left", func() bool { return a.st.Alive() == 1 })
	// a's egress view is not closed (1 failure, not open): new failures
	// now count in Redis.
	clk.Advance(2 * time.Second)
	for range 3 {
		record(t, a, clk, connRefused)
	}
	eventually(t, "open in Redis with a alone", func() bool { return sharedStatus(t, a, clk).State == "open" })
}

// TestReplicaScopedOpenRecovers (R-FD3): the replica's own open follows
// the route's cooldown and probes on that replica alone: after the
// cooldown one probe is admitted (a second is not), its success closes the
// replica's open, and the transitions are reported with scope replica.
func TestReplicaScopedOpenRecovers(t *testing.T) {
	rs, clk := quorumFleet(t, "quorumrec:", 2, 2, nil)
	a := rs[0]
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	for range 3 {
		record(t, a, clk, connRefused)
	}
	if v := a.st.Peek(ctx, a.key, now()); v.Allowed {
		t.Fatal("not open on a")
	}
	clk.Advance(1100 * time.Millisecond)
	adm, ok, err := a.st.Acquire(ctx, a.key, now(), false)
	if !ok || err != nil {
		t.Fatalf("the probe after the cooldown: %v %v", ok, err)
	}
	if _, ok2, _ := a.st.Acquire(ctx, a.key, now(), false); ok2 {
		t.Fatal("a second probe admitted with half_open_max_probes 1")
	}
	if _, err := a.st.Record(ctx, a.key, now(), adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200}); err != nil {
		t.Fatal(err)
	}
	if v := a.st.Peek(ctx, a.key, now()); !v.Allowed || v.ReplicaScoped {
		t.Fatalf("after the probe's success: %+v", v)
	}
	if st := sharedStatus(t, a, clk); st.ReplicaScope != nil {
		t.Fatalf("replica scope %+v after the close", st.ReplicaScope)
	}
	var scoped []string
	a.mu.Lock()
	for _, e := range a.events {
		if e.ReplicaScoped {
			scoped = append(scoped, e.Transition())
		}
	}
	a.mu.Unlock()
	if want := []string{"closed->open", "open->half_open", "half_open->closed"}; !slices.Equal(scoped, want) {
		t.Fatalf("replica-scoped transitions %v, want %v", scoped, want)
	}
}

// TestReplicaScopedOpenInShadow (R-M4): a shadow breaker's replica-scoped
// open is what would have been skipped; the route is still admitted.
func TestReplicaScopedOpenInShadow(t *testing.T) {
	rs, clk := quorumFleet(t, "quorumshadow:", 2, 2, func(p *breaker.Policy) { p.Mode = breaker.ModeShadow })
	a := rs[0]
	ctx := context.Background()
	for range 3 {
		record(t, a, clk, connRefused)
	}
	v := a.st.Peek(ctx, a.key, clk.Now().UnixNano())
	if !v.Shadow || v.Allowed || !v.ReplicaScoped {
		t.Fatalf("shadow verdict %+v, want shadow, would skip, replica-scoped", v)
	}
	if _, ok, _ := a.st.Acquire(ctx, a.key, clk.Now().UnixNano(), false); !ok {
		t.Fatal("a shadow breaker refused a request")
	}
}

// TestAliveIsRealTime (R-FD2): a replica's beat counts for aliveFor of
// real time, whatever a test's clock says. Before, a store under a test's
// clock beat with that clock's time: the simulation moves its clock a
// second per step, far faster than replicas beat, so a beat read the
// other replica's as older than aliveFor, counted one replica alive, and
// one pod's local failures opened the route for the fleet (simulate
// -scenario egress on a loaded CI machine).
func TestAliveIsRealTime(t *testing.T) {
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicasWith(t, srv.Client(t), "alivereal:", clk, replicaPolicy(nil), 2, time.Second, func(_ int, o *redisstore.Options) {
		o.RefreshInterval = time.Hour // beats only when the test says
	})
	ctx := context.Background()
	rs[0].st.BeatNow(ctx)
	rs[1].st.BeatNow(ctx)
	clk.Advance(time.Minute) // four times aliveFor on the test's clock
	rs[0].st.BeatNow(ctx)
	if n := rs[0].st.Alive(); n != 2 {
		t.Fatalf("%d replicas alive a test-clock minute on, want 2 (both beat a moment ago)", n)
	}
}

// TestHeldFailuresCarryIntoABlip (R-FD2, R-ST4): replica a's connection
// failures held for the quorum stay its egress view's evidence while Redis
// is away. Two are held, Redis stops answering a, and the third opens a's
// own view at the threshold. Before, a degraded store recorded local
// failures on the fallback view alone, which had counted none of the held
// ones: a loaded e2e run's pod sent 5 attempts to its broken egress
// across a blip, with a threshold of 3.
func TestHeldFailuresCarryIntoABlip(t *testing.T) {
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs, p.HalfOpenMaxProbes, p.LocalOriginQuorum = 3, 1000, 1, 2
	})
	a := replicasWith(t, proxiedClient(t, px), "heldblip:", clk, p, 1, 100*time.Millisecond, nil)[0]
	b := replicasWith(t, srv.Client(t), "heldblip:", clk, p, 1, time.Second, func(_ int, o *redisstore.Options) { o.ReplicaID = "b" })[0]
	for _, r := range []*replica{a, b} {
		eventually(t, "both replicas alive", func() bool { return r.st.Alive() == 2 })
	}
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	for range 2 {
		record(t, a, clk, connRefused)
	}
	if v := a.st.Peek(ctx, a.key, now()); !v.Allowed {
		t.Fatalf("a refuses after 2 of 3 held failures: %+v", v)
	}
	px.Stall(true)
	record(t, a, clk, breaker.Result{Kind: breaker.KindStatus, Status: 200})
	eventually(t, "a degraded", func() bool { return a.st.Degraded() })
	record(t, a, clk, connRefused)
	if v := a.st.Peek(ctx, a.key, now()); v.Allowed || !v.ReplicaScoped {
		t.Fatalf("a's view after its third local failure, Redis away: %+v, want refused by its own egress view", v)
	}
	px.Stall(false)
	eventually(t, "the resync", func() bool { return !a.st.Degraded() })
	if st := sharedStatus(t, b, clk); st.State != "closed" {
		t.Fatalf("the fleet after one replica's refusals across a blip: %s, want closed", st.State)
	}
}
