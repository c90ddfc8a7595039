package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

func benchTarget() (*breaker.Memory, breaker.Key) {
	st := breaker.NewMemory(nil)
	p := breaker.DefaultPolicy()
	p.Enabled = true
	keys, _, _ := st.Install(context.Background(), time.Now().UnixNano(), []breaker.Spec{{ID: breaker.RouteID("gw", "openai:us:m"), Policy: p.Finish()}})
	return st, keys[0]
}

var bctx = context.Background()

// The decision on a closed route, as the processor makes it: one clock
// read and one Peek through the Store interface (R-ST1: no allocation).
func BenchmarkDecisionClosed(b *testing.B) {
	st, k := benchTarget()
	var s breaker.Store = st
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	b.ReportAllocs()
	for b.Loop() {
		if v := s.Peek(bctx, k, clk.Now().UnixNano()); !v.Allowed {
			b.Fatal("not allowed")
		}
	}
}

func BenchmarkDecisionClosedNoClock(b *testing.B) {
	st, k := benchTarget()
	var s breaker.Store = st
	b.ReportAllocs()
	for b.Loop() {
		if v := s.Peek(bctx, k, 0); !v.Allowed {
			b.Fatal("not allowed")
		}
	}
}

func BenchmarkRecordSuccess(b *testing.B) {
	st, k := benchTarget()
	var s breaker.Store = st
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Record(bctx, k, clk.Now().UnixNano(), breaker.Admission{Gen: 1}, r)
	}
}

func BenchmarkRecordFailureSliding(b *testing.B) {
	st := breaker.NewMemory(nil)
	p := breaker.DefaultPolicy()
	p.Enabled, p.Window, p.FailureThreshold = true, breaker.WindowSliding, 1000000
	keys, _, _ := st.Install(bctx, time.Now().UnixNano(), []breaker.Spec{{ID: breaker.RouteID("gw", "openai:us:m"), Policy: p.Finish()}})
	var s breaker.Store = st
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindStatus, Status: 500}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Record(bctx, keys[0], clk.Now().UnixNano(), breaker.Admission{Gen: 1}, r)
	}
}

// Decide + admit + record, the whole per-attempt cost; the figure compared
// with sony/gobreaker's Allow+done in test/bench.
func BenchmarkDecideAndRecord(b *testing.B) {
	st, k := benchTarget()
	var s breaker.Store = st
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		now := clk.Now().UnixNano()
		_ = s.Peek(bctx, k, now)
		adm, _, _ := s.Acquire(bctx, k, now, false)
		_, _ = s.Record(bctx, k, clk.Now().UnixNano(), adm, r)
	}
}

func BenchmarkDecisionClosedParallel(b *testing.B) {
	st, k := benchTarget()
	var s breaker.Store = st
	clk := breaker.NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := clk.Now().UnixNano()
			_ = s.Peek(bctx, k, now)
			_, _, _ = s.Acquire(bctx, k, now, false)
		}
	})
}

// The system clock's cost on this machine, the baseline the coarse clock
// avoids.
func BenchmarkSystemClock(b *testing.B) {
	for b.Loop() {
		_ = breaker.SystemClock{}.Now().UnixNano()
	}
}

func BenchmarkCoarseClock(b *testing.B) {
	c := breaker.NewCoarseClock(time.Millisecond)
	defer c.Stop()
	for b.Loop() {
		_ = c.Now().UnixNano()
	}
}
