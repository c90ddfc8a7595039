package redisstore_test

import (
	"context"
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
		st := redisstore.New(redisstore.Options{Client: client, KeyPrefix: "bench2:"})
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
