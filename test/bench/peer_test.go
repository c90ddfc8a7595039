package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/sony/gobreaker/v2"
)

var ctx = context.Background()

// fuseboxSetup returns the memory store behind the Store interface, as the
// processor uses it, with one installed breaker.
func fuseboxSetup() (breaker.Store, breaker.Key, struct{}) {
	p := breaker.DefaultPolicy()
	p.Enabled = true
	p.FailureThreshold = 1000000
	st := breaker.NewMemory(nil)
	keys, _, _ := st.Install(ctx, time.Now().UnixNano(), []breaker.Spec{{ID: breaker.RouteID("gw", "openai:us:m"), Policy: p.Finish()}})
	return st, keys[0], struct{}{}
}

// gobreaker's two-step breaker: Allow, then done(success). Its Allow and
// done each read the clock and take the mutex.
func BenchmarkGobreakerAllowDone(b *testing.B) {
	cb := gobreaker.NewTwoStepCircuitBreaker[any](gobreaker.Settings{
		Name:        "x",
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures > 1<<30 },
	})
	b.ReportAllocs()
	for b.Loop() {
		done, err := cb.Allow()
		if err != nil {
			b.Fatal(err)
		}
		done(nil)
	}
}

// gobreaker's Allow alone: its decision.
func BenchmarkGobreakerAllow(b *testing.B) {
	cb := gobreaker.NewTwoStepCircuitBreaker[any](gobreaker.Settings{Name: "x"})
	b.ReportAllocs()
	for b.Loop() {
		done, err := cb.Allow()
		if err != nil {
			b.Fatal(err)
		}
		_ = done
	}
}

// fusebox's decide + record, reading the clock for each as gobreaker does.
func BenchmarkFuseboxDecideRecord(b *testing.B) {
	st, br, _ := fuseboxSetup()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now().UnixNano()
		if v := st.Peek(ctx, br, now); !v.Allowed {
			b.Fatal("refused")
		}
		adm, _, _ := st.Acquire(ctx, br, now, false)
		st.Record(ctx, br, time.Now().UnixNano(), adm, r)
	}
}

// fusebox as it runs in production: the request path reads the coarse
// clock (breaker.CoarseClock).
func BenchmarkFuseboxDecideRecordCoarseClock(b *testing.B) {
	st, br, _ := fuseboxSetup()
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		now := clk.Now().UnixNano()
		if v := st.Peek(ctx, br, now); !v.Allowed {
			b.Fatal("refused")
		}
		adm, _, _ := st.Acquire(ctx, br, now, false)
		st.Record(ctx, br, clk.Now().UnixNano(), adm, r)
	}
}

func BenchmarkFuseboxDecideRecordCoarseClockParallel(b *testing.B) {
	st, br, _ := fuseboxSetup()
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := clk.Now().UnixNano()
			st.Peek(ctx, br, now)
			adm, _, _ := st.Acquire(ctx, br, now, false)
			st.Record(ctx, br, clk.Now().UnixNano(), adm, r)
		}
	})
}

// fusebox's decision as the request path makes it: the coarse clock, a
// Peek and an Acquire on a closed route.
func BenchmarkFuseboxDecisionCoarseClock(b *testing.B) {
	st, br, _ := fuseboxSetup()
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	b.ReportAllocs()
	for b.Loop() {
		now := clk.Now().UnixNano()
		st.Peek(ctx, br, now)
		st.Acquire(ctx, br, now, false)
	}
}

// fusebox's decision alone, clock read included.
func BenchmarkFuseboxDecision(b *testing.B) {
	st, br, _ := fuseboxSetup()
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now().UnixNano()
		st.Peek(ctx, br, now)
		st.Acquire(ctx, br, now, false)
	}
}

var errFail = errors.New("x")

func BenchmarkGobreakerAllowDoneParallel(b *testing.B) {
	cb := gobreaker.NewTwoStepCircuitBreaker[any](gobreaker.Settings{
		Name:        "x",
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures > 1<<30 },
	})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			done, _ := cb.Allow()
			done(nil)
		}
	})
	_ = errFail
}

func BenchmarkFuseboxDecideRecordParallel(b *testing.B) {
	st, br, _ := fuseboxSetup()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now().UnixNano()
			st.Peek(ctx, br, now)
			adm, _, _ := st.Acquire(ctx, br, now, false)
			st.Record(ctx, br, time.Now().UnixNano(), adm, r)
		}
	})
}
