package processor

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// #49's figures (FUSEBOX_FIGURES=1; make bench-replicas prints them): the
// live heap after five minutes at 1,000 decisions a second on two replicas
// in the observer profile — every decision made on replica A and observed
// on B, so A holds each until its note says B settled it, or its bound
// lets it go — and after a flood of 12,000 parks (the parked map holds
// 10,000). Both replicas run in this process, on one store and one
// injected clock, which advances 1 ms a decision.
func TestHeldHeapFigures(t *testing.T) {
	if os.Getenv("FUSEBOX_FIGURES") == "" {
		t.Skip("a figure: FUSEBOX_FIGURES=1")
	}
	live := func() float64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapAlloc) / (1 << 20)
	}
	t.Run("observer, two replicas, 5 minutes at 1,000 decisions/s", func(t *testing.T) {
		a := newObserverEnv(t)
		b := a.replica()
		base := live()
		const decisions, workers = 300_000, 8
		var mu sync.Mutex
		next := 0
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					mu.Lock()
					i := next
					next++
					if i < decisions {
						a.clk.Advance(time.Millisecond)
					}
					mu.Unlock()
					if i >= decisions {
						return
					}
					md := a.observedDecision("gpt")
					b.observe(md, "200", `{"choices":[]}`)
				}
			}()
		}
		wg.Wait()
		held := a.srv.held.n.Load()
		kept := a.srv.decisions.len()
		after := live()
		t.Logf("figures: %d decisions in %v; live heap %.1f MiB before, %.1f MiB after (+%.1f MiB); replica A holds %d decisions (bound %d), its table %d",
			decisions, time.Since(start).Round(time.Second), base, after, after-base, held, heldBound(), kept)
	})
	t.Run("a flood of 12,000 parks", func(t *testing.T) {
		e := newFailoverEnv(t)
		base := live()
		for range 12_000 {
			tok := e.routeRole()
			c, _, _ := e.attempt(tok, "flood", 1, "/v1/chat/completions")
			c.end()
		}
		eventually(t, "the map full", func() bool { return e.srv.meet.len() == e.srv.meet.max })
		after := live()
		t.Logf("figures: live heap %.1f MiB before, %.1f MiB after 12,000 parks (+%.1f MiB); the parked map holds %d (bound %d), %v parks in notes only",
			base, after, after-base, e.srv.meet.len(), e.srv.meet.max, e.decisionEvents("park", "not_held"))
	})
}
