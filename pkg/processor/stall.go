package processor

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// stallWatch finds streams that have gone quiet for longer than their
// route's stall_ms (R-T5) while they still run, so that the breaker counts
// the slow call at once, not when the stream ends. One heap of deadlines for
// the whole server: no goroutine and no timer per stream, and at most one
// entry per stream in flight.
type stallWatch struct {
	mu sync.Mutex
	h  stallHeap
}

// stallItem is one stream's entry.
type stallItem struct {
	st       *stream
	deadline int64 // last progress + stall_ms, unix ns
	progress int64 // the progress the deadline was set from
	index    int   // in the heap; -1 when out
}

type stallHeap []*stallItem

func (h stallHeap) Len() int           { return len(h) }
func (h stallHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h stallHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *stallHeap) Push(x any) {
	it := x.(*stallItem)
	it.index = len(*h)
	*h = append(*h, it)
}
func (h *stallHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	it.index = -1
	*h = old[:len(old)-1]
	return it
}

// touch sets a stream's deadline from its latest progress.
func (w *stallWatch) touch(st *stream, progress, stallNs int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	it := st.stall
	if it == nil {
		it = &stallItem{st: st, index: -1}
		st.stall = it
	}
	if it.progress == progress && it.index >= 0 {
		return
	}
	it.progress, it.deadline = progress, progress+stallNs
	if it.index >= 0 {
		heap.Fix(&w.h, it.index)
	} else {
		heap.Push(&w.h, it)
	}
}

// forget removes a stream (it ended, or its stall was counted).
func (w *stallWatch) forget(st *stream) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if it := st.stall; it != nil && it.index >= 0 {
		heap.Remove(&w.h, it.index)
	}
}

func (w *stallWatch) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.h.Len()
}

// due pops the streams whose deadline has passed.
func (w *stallWatch) due(now int64) []*stream {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*stream
	for w.h.Len() > 0 && w.h[0].deadline <= now {
		out = append(out, heap.Pop(&w.h).(*stallItem).st)
	}
	return out
}

// checkStalls counts every stream stalled at now as a slow call (once per
// attempt) on its breakers.
func (s *Server) checkStalls(now int64) {
	for _, st := range s.stalls.due(now) {
		if st.stallState.CompareAndSwap(stallOpen, stallCounted) {
			ctx := context.Background()
			t := st.target
			if err := s.store.Stalled(ctx, t.Route, now); err != nil {
				s.metrics.StoreErrors.WithLabelValues("stalled").Inc()
			}
			if t.HasFleet {
				_ = s.store.Stalled(ctx, t.Fleet, now)
			}
		}
	}
}

// RunStallWatch checks for stalled streams every interval until ctx ends,
// and lets the decision table go when traffic stops (decisionTable.tidy).
func (s *Server) RunStallWatch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.stalls.len() > 0 {
				s.checkStalls(s.clock.Now().UnixNano())
			}
			s.decisions.tidy(time.Now())
		}
	}
}
