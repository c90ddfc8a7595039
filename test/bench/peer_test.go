package bench

import (
	"errors"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/sony/gobreaker/v2"
)

func fuseboxSetup() (*breaker.Memory, *breaker.Breaker, *breaker.Policy) {
	p := breaker.DefaultPolicy()
	p.Enabled = true
	p.FailureThreshold = 1 << 30
	p.Finish()
	st := breaker.NewMemory(nil)
	return st, st.Breaker(breaker.RouteID("gw", "openai:us:m"), &p), &p
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
	st, br, p := fuseboxSetup()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now().UnixNano()
		if v := br.Peek(now, p); !v.Allowed {
			b.Fatal("refused")
		}
		adm, _ := st.Acquire(br, now, p, false, false)
		st.Record(br, time.Now().UnixNano(), p, adm, r)
	}
}

// fusebox as it runs in production: the request path reads the coarse
// clock (breaker.CoarseClock).
func BenchmarkFuseboxDecideRecordCoarseClock(b *testing.B) {
	st, br, p := fuseboxSetup()
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		now := clk.Now().UnixNano()
		if v := br.Peek(now, p); !v.Allowed {
			b.Fatal("refused")
		}
		adm, _ := st.Acquire(br, now, p, false, false)
		st.Record(br, clk.Now().UnixNano(), p, adm, r)
	}
}

func BenchmarkFuseboxDecideRecordCoarseClockParallel(b *testing.B) {
	st, br, p := fuseboxSetup()
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := clk.Now().UnixNano()
			br.Peek(now, p)
			adm, _ := st.Acquire(br, now, p, false, false)
			st.Record(br, clk.Now().UnixNano(), p, adm, r)
		}
	})
}

// fusebox's decision alone, clock read included.
func BenchmarkFuseboxDecision(b *testing.B) {
	st, br, p := fuseboxSetup()
	b.ReportAllocs()
	for b.Loop() {
		now := time.Now().UnixNano()
		br.Peek(now, p)
		st.Acquire(br, now, p, false, false)
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
	st, br, p := fuseboxSetup()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := time.Now().UnixNano()
			br.Peek(now, p)
			adm, _ := st.Acquire(br, now, p, false, false)
			st.Record(br, time.Now().UnixNano(), p, adm, r)
		}
	})
}
