package breaker

import (
	"testing"
	"time"
)

func benchTarget() (*Memory, *Breaker, *Policy) {
	p := pol(func(p *Policy) { p.FailureThreshold = 1 << 30 })
	st := NewMemory(nil)
	return st, st.Breaker(RouteID("gw", "openai:us:m"), p), p
}

// A decision on a closed route: read the clock, peek, admit.
func BenchmarkDecisionClosed(b *testing.B) {
	st, br, p := benchTarget()
	clk := NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	b.ReportAllocs()
	for b.Loop() {
		now := clk.Now().UnixNano()
		if v := br.Peek(now, p); !v.Allowed {
			b.Fatal("refused")
		}
		if _, ok := st.Acquire(br, now, p, false, false); !ok {
			b.Fatal("refused")
		}
	}
}

// The same without the clock read (a caller that reads the clock once per
// request for other reasons).
func BenchmarkDecisionClosedNoClock(b *testing.B) {
	st, br, p := benchTarget()
	now := time.Now().UnixNano()
	b.ReportAllocs()
	for b.Loop() {
		if v := br.Peek(now, p); !v.Allowed {
			b.Fatal("refused")
		}
		if _, ok := st.Acquire(br, now, p, false, false); !ok {
			b.Fatal("refused")
		}
	}
}

// Recording a success on a closed route, clock read included.
func BenchmarkRecordSuccess(b *testing.B) {
	st, br, p := benchTarget()
	clk := NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	adm, _ := st.Acquire(br, clk.Now().UnixNano(), p, false, false)
	r := Result{Kind: KindAnswered, Status: 200, ElapsedMs: 120}
	b.ReportAllocs()
	for b.Loop() {
		st.Record(br, clk.Now().UnixNano(), p, adm, r)
	}
}

func BenchmarkRecordFailureSliding(b *testing.B) {
	p := pol(func(p *Policy) {
		p.FailureThreshold = 1 << 30
		p.Window = WindowSliding
		p.FailureRatePercent = 99
		p.MinimumRequests = 1 << 30
	})
	st := NewMemory(nil)
	br := st.Breaker(RouteID("gw", "openai:us:m"), p)
	clk := NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	adm, _ := st.Acquire(br, clk.Now().UnixNano(), p, false, false)
	r := Result{Kind: KindStatus, Status: 500}
	b.ReportAllocs()
	for b.Loop() {
		st.Record(br, clk.Now().UnixNano(), p, adm, r)
	}
}

// Full cycle: decide and record, the unit gobreaker's Allow+done is compared
// against (test/bench).
func BenchmarkDecideAndRecord(b *testing.B) {
	st, br, p := benchTarget()
	clk := NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	r := Result{Kind: KindAnswered, Status: 200}
	b.ReportAllocs()
	for b.Loop() {
		now := clk.Now().UnixNano()
		br.Peek(now, p)
		adm, _ := st.Acquire(br, now, p, false, false)
		st.Record(br, clk.Now().UnixNano(), p, adm, r)
	}
}

func BenchmarkDecisionClosedParallel(b *testing.B) {
	st, br, p := benchTarget()
	clk := NewCoarseClock(time.Millisecond)
	defer clk.Stop()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			now := clk.Now().UnixNano()
			br.Peek(now, p)
			st.Acquire(br, now, p, false, false)
		}
	})
}

// The system clock's cost on this machine, the baseline the coarse clock
// avoids.
func BenchmarkSystemClock(b *testing.B) {
	for b.Loop() {
		_ = SystemClock{}.Now().UnixNano()
	}
}

func BenchmarkCoarseClock(b *testing.B) {
	c := NewCoarseClock(time.Millisecond)
	defer c.Stop()
	for b.Loop() {
		_ = c.Now().UnixNano()
	}
}
