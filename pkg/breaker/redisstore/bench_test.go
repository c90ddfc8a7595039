package redisstore_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// One run compares, on loopback Redis: a bare EVALSHA of an empty script
// (the floor of any one-round-trip store), fusebox's record and probe-slot
// calls, and the memory store's record.
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	client := srv.Client(b)
	ctx := context.Background()
	p := breaker.DefaultPolicy()
	p.Enabled, p.FailureThreshold, p.HalfOpenMaxProbes, p.ConsecutiveFailures = true, 1000000, 1, 0
	pol := p.Finish()
	id := breaker.RouteID("bench", "openai:us:m")
	now := time.Now().UnixNano()

	b.Run("floor_empty_evalsha", func(b *testing.B) {
		empty := redis.NewScript(`return 1`)
		_ = empty.Run(ctx, client, []string{"{bench}:x"}).Err()
		b.ReportAllocs()
		for b.Loop() {
			if err := empty.Run(ctx, client, []string{"{bench}:x"}).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("record_success", func(b *testing.B) {
		st := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "bench1:"})
		keys, _, _ := st.Install(ctx, now, []breaker.Spec{{ID: id, Policy: pol}})
		r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
		adm, _, _ := st.Acquire(ctx, keys[0], now, false)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := st.Record(ctx, keys[0], now, adm, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("probe_slot_acquire_release", func(b *testing.B) {
		// The test's clock (TestClock): the setup moves time a minute on,
		// past the cooldown, which Redis's own clock would not see.
		st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "bench2:"})
		keys, _, _ := st.Install(ctx, now, []breaker.Spec{{ID: id, Policy: pol}})
		k := keys[0]
		_ = st.ForceOpen(ctx, k, now, 0)
		_ = st.ForceClose(ctx, k, now)
		// Open it and let the cooldown pass: half-open with one slot.
		adm, _, _ := st.Acquire(ctx, k, now, true)
		_, _ = st.Record(ctx, k, now, adm, breaker.Result{Kind: breaker.KindStatus, Status: 401}) // not a failure
		q := p
		q.OpenOnStatusCodes = []int{401}
		_, _, _ = st.Install(ctx, now, []breaker.Spec{{ID: id, Policy: q.Finish()}})
		adm, _, _ = st.Acquire(ctx, k, now, true)
		_, _ = st.Record(ctx, k, now, adm, breaker.Result{Kind: breaker.KindStatus, Status: 401})
		later := now + int64(time.Minute)
		if s, _ := st.Status(ctx, k, later); s.State != "half_open" {
			b.Fatalf("setup: %s", s.State)
		}
		b.ReportAllocs()
		for b.Loop() {
			a, ok, err := st.Acquire(ctx, k, later, false)
			if err != nil || !ok || a.Lease == 0 {
				b.Fatalf("acquire %v %v %v", a, ok, err)
			}
			if err := st.Release(ctx, k, a); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("memory_record_success", func(b *testing.B) {
		st := breaker.NewMemory(nil)
		keys, _, _ := st.Install(ctx, now, []breaker.Spec{{ID: id, Policy: pol}})
		r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = st.Record(ctx, keys[0], now, breaker.Admission{Gen: 1}, r)
		}
	})
}

// The decision's cost on the Redis store's local view against the memory
// store's, in one run: Peek then Acquire on a closed route, what every
// decision does. Neither makes a round trip.
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Start(b)
	client := srv.Client(b)
	ctx := context.Background()
	p := breaker.DefaultPolicy()
	p.Enabled = true
	pol := p.Finish()
	id := breaker.RouteID("bench", "openai:us:m")
	now := time.Now().UnixNano()
	run := func(b *testing.B, st breaker.Store) {
		keys, _, err := st.Install(ctx, now, []breaker.Spec{{ID: id, Policy: pol}})
		if err != nil {
			b.Fatal(err)
		}
		k := keys[0]
		b.ReportAllocs()
		for b.Loop() {
			if v := st.Peek(ctx, k, now); !v.Allowed {
				b.Fatal("not allowed")
			}
			if _, ok, _ := st.Acquire(ctx, k, now, false); !ok {
				b.Fatal("refused")
			}
		}
	}
	b.Run("memory", func(b *testing.B) { run(b, breaker.NewMemory(nil)) })
	b.Run("redis_view", func(b *testing.B) {
		run(b, redisstore.New(redisstore.Options{Client: client, KeyPrefix: "decide:"}))
	})
}

// How long a transition made by one replica takes to reach another's local
// view through the feed, on loopback: replica A forces the route open and
// closed in turn, replica B's view is watched. Run with -benchtime=1000x
// (make bench-replicas): 2,000 transitions.
func BenchmarkTransitionPropagation(b *testing.B) {
	srv := redistest.Start(b)
	client := srv.Client(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := breaker.DefaultPolicy()
	p.Enabled = true
	pol := p.Finish()
	id := breaker.RouteID("bench", "openai:us:m")
	seen := make(chan breaker.State, 16)
	mk := func(name string, onView func(breaker.ID, breaker.State)) (*redisstore.Store, breaker.Key) {
		st := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "prop:", ReplicaID: name, OnView: onView,
			OpTimeout: time.Second, RefreshInterval: time.Hour})
		keys, _, _ := st.Install(ctx, time.Now().UnixNano(), []breaker.Spec{{ID: id, Policy: pol}})
		wg := st.Start(ctx)
		b.Cleanup(wg.Wait)
		for !st.Ready() {
			time.Sleep(time.Millisecond)
		}
		return st, keys[0]
	}
	a, ka := mk("a", nil)
	_, _ = mk("b", func(_ breaker.ID, st breaker.State) { seen <- st })
	time.Sleep(50 * time.Millisecond) // both subscribed
	var lat []time.Duration
	wait := func(want breaker.State, t0 time.Time) {
		for {
			select {
			case st := <-seen:
				if st == want {
					lat = append(lat, time.Since(t0))
					return
				}
			case <-time.After(5 * time.Second):
				b.Fatalf("replica b never saw %v", want)
			}
		}
	}
	for b.Loop() {
		t0 := time.Now()
		if err := a.ForceOpen(ctx, ka, time.Now().UnixNano(), 0); err != nil {
			b.Fatal(err)
		}
		wait(breaker.Open, t0)
		t0 = time.Now()
		if err := a.ForceClose(ctx, ka, time.Now().UnixNano()); err != nil {
			b.Fatal(err)
		}
		wait(breaker.Closed, t0)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50_µs")
	b.ReportMetric(q(0.99), "p99_µs")
	b.ReportMetric(float64(len(lat)), "transitions")
}
