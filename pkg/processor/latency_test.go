package processor

import (
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/judge"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

const chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"tok \"}}]}\n\n"

// R-T5: a stream that stalls 10 s after its first token counts as a slow
// call the moment the gap passes stall_ms, while it still runs; its end
// does not count it again; the breaker opens naming the stall.
func TestStallCountsWhileStreaming(t *testing.T) {
	e := newEnv(t)
	stall := func() *call {
		c := e.open("")
		c.chat("stally")
		c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
		c.respBody(chunk, false)
		e.clk.Advance(10 * time.Second) // silence
		e.srv.checkStalls(e.clk.Now().UnixNano())
		return c
	}
	c := stall()
	if s := e.status("default", "openai:us:stl"); s.WindowCalls != 1 || s.WindowSlowCalls != 1 || s.State != "closed" {
		t.Fatalf("while stalled: %+v", s)
	}
	// Checking again counts nothing more.
	e.srv.checkStalls(e.clk.Now().UnixNano())
	c.respBody(chunk, false)
	c.respBody("data: [DONE]\n\n", true)
	c.end()
	if s := e.status("default", "openai:us:stl"); s.WindowCalls != 1 || s.WindowSlowCalls != 1 {
		t.Fatalf("the stalled stream was counted twice: %+v", s)
	}
	// A stream that keeps its tokens coming is not slow.
	c = e.open("")
	c.chat("stally")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
	for i := 0; i < 5; i++ {
		c.respBody(chunk, false)
		e.clk.Advance(2 * time.Second)
		e.srv.checkStalls(e.clk.Now().UnixNano())
	}
	c.respBody("data: [DONE]\n\n", true)
	c.end()
	if s := e.status("default", "openai:us:stl"); s.WindowCalls != 2 || s.WindowSlowCalls != 1 {
		t.Fatalf("a steady stream counted as slow: %+v", s)
	}
	// A second stall while running: 2 slow of 3, open at once.
	c = stall()
	if s := e.status("default", "openai:us:stl"); s.State != "open" || s.Reason != breaker.ReasonSlowCallRateStall {
		t.Fatalf("want open on slow_call_rate:stall while the stream still runs, got %+v", s)
	}
	c.end()
}

// roundTripTimed runs a non-streaming request for model whose answer takes
// d on the fake clock.
func (e *env) roundTripTimed(model string, d time.Duration) {
	e.t.Helper()
	c := e.open("")
	c.chat(model)
	e.clk.Advance(d)
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()
}

// R-T6: a route whose latency triples while every answer still succeeds
// opens on the slow-call rate, named by the baseline.
func TestLatencyTriplingOpensOnBaseline(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 25; i++ {
		e.roundTripTimed("basem", 100*time.Millisecond)
		e.clk.Advance(time.Second)
	}
	base := e.srv.LatencyBaselineMs(breaker.RouteID("default", "openai:us:bas"), e.clk.Now().UnixNano())
	if base < 88 || base > 112 {
		t.Fatalf("baseline %d ms, want 100 ± 12 %%", base)
	}
	if s := e.status("default", "openai:us:bas"); s.State != "closed" || s.WindowSlowCalls != 0 {
		t.Fatalf("before: %+v", s)
	}
	for i := 0; i < 12 && e.status("default", "openai:us:bas").State == "closed"; i++ {
		e.roundTripTimed("basem", 300*time.Millisecond)
		e.clk.Advance(time.Second)
	}
	if s := e.status("default", "openai:us:bas"); s.State != "open" || s.Reason != breaker.ReasonSlowCallRateBaseline {
		t.Fatalf("want open on slow_call_rate:judge.Baseline, got %+v", s)
	}
}

// R-T6: a route that is always slow has a slow baseline too: it never
// opens on it.
func TestAlwaysSlowRouteDoesNotOpenOnBaseline(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 60; i++ {
		e.roundTripTimed("basem", 3*time.Second)
		e.clk.Advance(time.Second)
	}
	if s := e.status("default", "openai:us:bas"); s.State != "closed" || s.WindowSlowCalls != 0 {
		t.Fatalf("an always-slow route: %+v", s)
	}
	if b := e.srv.LatencyBaselineMs(breaker.RouteID("default", "openai:us:bas"), e.clk.Now().UnixNano()); b < 2600 || b > 3400 {
		t.Fatalf("baseline %d", b)
	}
}

// The record path with both latency signals on, against the same path
// without them, in one run: the Judge's extra tests, the baseline lookup
// (cached for a second) and the histogram update. Target: within 1.2×, no
// allocation.
func BenchmarkRecordPath(b *testing.B) {
	ctx := b.Context()
	for _, tc := range []struct {
		name    string
		signals bool
	}{{"plain", false}, {"stall_and_baseline", true}} {
		b.Run(tc.name, func(b *testing.B) {
			p := breaker.DefaultPolicy()
			p.Enabled, p.FailureThreshold = true, 1000000
			if tc.signals {
				p.StallMs, p.BaselineMultiplier = 5000, 3
			}
			st := breaker.NewMemory(nil)
			id := breaker.RouteID("g", "p:r:m")
			now := testT0.UnixNano()
			keys, _, _ := st.Install(ctx, now, []breaker.Spec{{ID: id, Policy: p.Finish()}})
			bl := judge.NewBaselines().Get(id)
			for i := 0; i < 50; i++ {
				bl.Add(100, now)
			}
			res := breaker.Result{Kind: breaker.KindAnswered, Status: 200, ElapsedMs: 120, MaxGapMs: 40}
			b.ReportAllocs()
			for b.Loop() {
				r := res
				if tc.signals {
					r.BaselineMs = bl.P50(now)
				}
				rec, _ := st.Record(ctx, keys[0], now, breaker.Admission{Gen: 1}, r)
				if tc.signals && rec.Outcome.Class == breaker.Success {
					bl.Add(r.ElapsedMs, now)
				}
			}
		})
	}
}
