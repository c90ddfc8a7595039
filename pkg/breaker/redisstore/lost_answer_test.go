package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestTimedOutAcquireFreesItsSlot (#36): a probe's acq that times out on
// the replica but ran in Redis took the half-open slot there. The replica
// chose the lease's id, so it releases that slot when Redis answers again,
// before its resync. Before, Redis gave the id, the replica never learned
// it, and with half_open_max_probes 1 the route took no probe at all until
// probe_timeout_ms (here never: the test's clock stands still).
// openOnTwo: replica a behind the fault proxy (op timeout 100 ms), b on
// Redis itself, one route opened by a (threshold 1, cooldown 1 s, one
// probe) and seen open in Redis.
func openOnTwo(t *testing.T, prefix string) (px *redistest.Proxy, a, b *replica, clk *breaker.FakeClock) {
	t.Helper()
	srv := redistest.Start(t)
	px = srv.Proxy(t)
	clk = breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.CooldownMs, p.HalfOpenMaxProbes, p.ProbeTimeoutMs = 1, 1000, 1, 60000
	})
	a = replicasWith(t, proxiedClient(t, px), prefix, clk, p, 1, 100*time.Millisecond, nil)[0]
	b = replicasWith(t, srv.Client(t), prefix, clk, p, 1, time.Second, func(_ int, o *redisstore.Options) {
		o.ReplicaID = "b"
	})[0]
	recordFail(t, a, clk)
	eventuallyOpen(t, "open in Redis", b, clk)
	return px, a, b, clk
}

func TestTimedOutAcquireFreesItsSlot(t *testing.T) {
	px, a, b, clk := openOnTwo(t, "lease:")
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	clk.Advance(time.Second)
	// A warm connection, so that the acq itself is sent at once (a new one
	// would wait for its handshake's delayed answer and send nothing).
	for range 3 {
		if _, err := a.st.Status(ctx, a.key, now()); err != nil {
			t.Fatal(err)
		}
	}
	px.Latency(0, 300*time.Millisecond) // the answer comes after the replica gave up
	if _, _, err := a.st.Acquire(ctx, a.key, now(), false); err == nil {
		t.Fatal("the acq did not time out")
	}
	if s, _ := b.st.Status(ctx, b.key, now()); s.State != "half_open" || s.ProbesInFlight != 1 {
		t.Fatalf("the timed-out acq did not take the slot in Redis: %+v", s)
	}
	px.Latency(0, 0)
	eventually(t, "the slot freed", func() bool {
		s, err := b.st.Status(ctx, b.key, now())
		return err == nil && s.ProbesInFlight == 0
	})
	if _, ok, err := b.st.Acquire(ctx, b.key, now(), false); !ok || err != nil {
		t.Fatalf("another replica's probe was refused: %v", err)
	}
}

// lostAnswer: replica a (behind the fault proxy) records one failure that
// Redis answers, then one whose answer is lost (Redis runs it, the reply
// comes after a's 100 ms op timeout), then Redis is fast again and a
// resyncs. b reads Redis directly.
func lostAnswer(t *testing.T, threshold int) (a *replica, status func() breaker.Status, opens func() int, clk *breaker.FakeClock) {
	t.Helper()
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	clk = breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = threshold })
	a = replicasWith(t, proxiedClient(t, px), "lost:", clk, p, 1, 100*time.Millisecond, nil)[0]
	b := replicasWith(t, srv.Client(t), "lost:", clk, p, 1, time.Second, func(_ int, o *redisstore.Options) {
		o.ReplicaID = "b"
	})[0]
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	status = func() breaker.Status {
		s, err := b.st.Status(ctx, b.key, now())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	opens = func() int {
		n := 0
		for _, r := range []*replica{a, b} {
			for _, tr := range r.transitions() {
				if tr == "closed->open" {
					n++
				}
			}
		}
		return n
	}
	recordFail(t, a, clk)
	eventually(t, "failure 1 in Redis", func() bool { return status().Failures == 1 })
	for range 3 { // a warm connection: the record is sent at once
		if _, err := a.st.Status(ctx, a.key, now()); err != nil {
			t.Fatal(err)
		}
	}
	px.Latency(0, 300*time.Millisecond)
	recordFail(t, a, clk)
	eventually(t, "the record timed out", func() bool { return a.st.Degraded() })
	eventually(t, "failure 2 in Redis", func() bool { s := status(); return s.Failures == 2 || s.State == "open" })
	px.Latency(0, 0)
	eventually(t, "the resync", func() bool { return !a.st.Degraded() })
	return a, status, opens, clk
}

// TestLostAnswerCountsOnce (#36): a record whose call timed out on the
// replica after Redis ran it is sent again before the resync; Redis
// applies an outcome once (by the replica's id for it). With threshold 3:
// one failure answered, one whose answer was lost, and after the resync
// the route is closed with 2 failures; the third opens it, and the one
// transition is reported once. Before, the resent failure counted again
// and two real failures opened the route.
func TestLostAnswerCountsOnce(t *testing.T) {
	a, status, opens, clk := lostAnswer(t, 3)
	if s := status(); s.State != "closed" || s.Failures != 2 {
		t.Fatalf("after the resync Redis has %s with %d failures: the lost answer's failure counted twice", s.State, s.Failures)
	}
	recordFail(t, a, clk)
	eventually(t, "open", func() bool { return status().State == "open" })
	eventually(t, "the open reported", func() bool { return opens() > 0 })
	if n := opens(); n != 1 {
		t.Fatalf("%d closed->open transitions reported, want 1", n)
	}
}

// TestLostAnswerTransitionIsReported (#36): when the record whose answer
// was lost is the one that opened the route, the repeat sent before the
// resync answers the transitions the first call made, and the replica
// reports them: the open is logged and counted once. Before, nobody
// reported it (the answer was lost, and the resent failure found the
// route open).
func TestLostAnswerTransitionIsReported(t *testing.T) {
	_, status, opens, _ := lostAnswer(t, 2)
	if s := status(); s.State != "open" {
		t.Fatalf("Redis: %+v", s)
	}
	eventually(t, "the open reported", func() bool { return opens() > 0 })
	if n := opens(); n != 1 {
		t.Fatalf("%d closed->open transitions reported, want 1", n)
	}
}

// TestLostAcquireTransitionIsReported: a probe's acq that times out on
// the replica after Redis ran it turned the route half-open there; that
// transition is reported once, by that replica, when Redis answers again
// (it asks for the transitions of the call it lost). Before, nobody
// reported it: the replica never had the answer, and every later call
// found the route half-open already (the fleet soak's shared chain read
// half_open->closed after open).
func TestLostAcquireTransitionIsReported(t *testing.T) {
	px, a, b, clk := openOnTwo(t, "lostacq:")
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	for range 3 { // a warm connection (see TestTimedOutAcquireFreesItsSlot), before the cooldown ends
		if _, err := a.st.Status(ctx, a.key, now()); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second)
	// The shared state's (a's local view makes its own, decided_by=local,
	// while Redis does not answer).
	halfOpens := func() int {
		n := 0
		for _, r := range []*replica{a, b} {
			r.mu.Lock()
			for _, e := range r.events {
				if e.Transition() == "open->half_open" && e.DecidedBy == breaker.DecidedByRedis {
					n++
				}
			}
			r.mu.Unlock()
		}
		return n
	}
	if n := halfOpens(); n != 0 {
		t.Fatalf("%d open->half_open reported before the acq (the warm-up calls must not make it)", n)
	}
	// On a loaded machine a warm-up call can outlast the 100 ms op timeout
	// and leave a deciding on its local view, where the acq below would not
	// reach Redis at all (CI: "the acq did not time out"): it must read
	// Redis again first.
	eventually(t, "a reads Redis", func() bool { return !a.st.Degraded() })
	px.Latency(0, 300*time.Millisecond)
	if _, _, err := a.st.Acquire(ctx, a.key, now(), false); err == nil {
		t.Fatal("the acq did not time out")
	}
	if s, _ := b.st.Status(ctx, b.key, now()); s.State != "half_open" {
		t.Fatalf("the timed-out acq did not run in Redis: %+v", s)
	}
	px.Latency(0, 0)
	eventually(t, "the resync", func() bool { return !a.st.Degraded() })
	eventually(t, "the half-open reported", func() bool { return halfOpens() > 0 })
	clk.Advance(10 * time.Millisecond)
	a.st.Refresh(ctx)
	if n := halfOpens(); n != 1 {
		t.Fatalf("%d open->half_open transitions reported, want 1", n)
	}
}

// TestLostAcquireTransitionOutlivesTraffic: the transitions of a call whose
// answer was lost are kept until its caller asks for them, however many
// outcomes other replicas record meanwhile. Before, they were kept among
// the last 32 ids of any kind: on a busy route (the loaded fleet soak,
// 346 requests a second) 32 other records pushed them out within a
// fraction of a second, the caller's ask after its resync found nothing,
// and nobody reported the route's open->half_open (the shared chain read
// half_open->closed after open).
func TestLostAcquireTransitionOutlivesTraffic(t *testing.T) {
	px, a, b, clk := openOnTwo(t, "lostbusy:")
	ctx := context.Background()
	now := func() int64 { return clk.Now().UnixNano() }
	for range 3 { // a warm connection (see TestTimedOutAcquireFreesItsSlot)
		if _, err := a.st.Status(ctx, a.key, now()); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Second)
	eventually(t, "a reads Redis", func() bool { return !a.st.Degraded() })
	px.Latency(0, 300*time.Millisecond)
	if _, _, err := a.st.Acquire(ctx, a.key, now(), false); err == nil {
		t.Fatal("the acq did not time out")
	}
	// Another replica's traffic while a's answer is lost: 40 outcomes,
	// each with its id.
	for i := range 40 {
		adm, _, err := b.st.Acquire(ctx, b.key, now(), true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.st.Record(ctx, b.key, now(), adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200, Key: "busy" + strconv.Itoa(i) + ":1", KeyLifeMs: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "b's outcomes in Redis", b.st.Quiet)
	px.Latency(0, 0)
	eventually(t, "the resync", func() bool { return !a.st.Degraded() })
	halfOpens := func() int {
		return countEvents([]*replica{a, b}, func(e breaker.Event) bool {
			return e.Transition() == "open->half_open" && e.DecidedBy == breaker.DecidedByRedis
		})
	}
	eventually(t, "the half-open reported", func() bool { return halfOpens() > 0 })
	if n := halfOpens(); n != 1 {
		t.Fatalf("%d open->half_open transitions reported, want 1", n)
	}
}
