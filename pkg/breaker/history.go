package breaker

import "sync"

// The outcome history of the dashboard's sparklines (R-API5) and its
// 15-minute chart (R-API7): per breaker, how many successes, failures and
// neithers were recorded in each of the last HistoryBuckets periods of
// HistoryBucketSec. A ring per breaker: fixed memory (90 periods, 2 KiB),
// no Prometheus needed.
const (
	HistoryBucketSec = 10
	HistoryBuckets   = 90
	// SparkBuckets are the sparkline's: the last 5 minutes.
	SparkBuckets = 30
)

// HistoryPoint is one period: its start (unix seconds) and its counts.
type HistoryPoint struct {
	At      int64 `json:"at"`
	Success int   `json:"success"`
	Failure int   `json:"failure"`
	Neither int   `json:"neither"`
}

// History keeps the rings. Safe for concurrent use.
type History struct {
	mu    sync.RWMutex
	rings map[ID]*ring
}

type ring struct {
	mu sync.Mutex
	b  [HistoryBuckets]HistoryPoint
}

// NewHistory returns an empty history.
func NewHistory() *History { return &History{rings: map[ID]*ring{}} }

// Add counts one outcome of class c for breaker id at now (unix ns).
func (h *History) Add(id ID, c Class, now int64) {
	if h == nil {
		return
	}
	h.mu.RLock()
	r := h.rings[id]
	h.mu.RUnlock()
	if r == nil {
		h.mu.Lock()
		if r = h.rings[id]; r == nil {
			r = &ring{}
			h.rings[id] = r
		}
		h.mu.Unlock()
	}
	at := now / 1e9 / HistoryBucketSec * HistoryBucketSec
	r.mu.Lock()
	p := &r.b[(at/HistoryBucketSec)%HistoryBuckets]
	if p.At != at {
		*p = HistoryPoint{At: at}
	}
	switch c {
	case Success:
		p.Success++
	case Failure:
		p.Failure++
	default:
		p.Neither++
	}
	r.mu.Unlock()
}

// Points returns the last n periods up to now (at most HistoryBuckets),
// oldest first; periods with nothing recorded are zero.
func (h *History) Points(id ID, now int64, n int) []HistoryPoint {
	n = min(max(n, 0), HistoryBuckets)
	cur := now / 1e9 / HistoryBucketSec * HistoryBucketSec
	out := make([]HistoryPoint, n)
	for i := range out {
		out[i].At = cur - int64(n-1-i)*HistoryBucketSec
	}
	if h == nil {
		return out
	}
	h.mu.RLock()
	r := h.rings[id]
	h.mu.RUnlock()
	if r == nil {
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range out {
		if p := r.b[(out[i].At/HistoryBucketSec)%HistoryBuckets]; p.At == out[i].At {
			out[i] = p
		}
	}
	return out
}

// Retain drops the rings of breakers not in keep (a reload removed them).
func (h *History) Retain(keep map[ID]bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.rings {
		if !keep[id] {
			delete(h.rings, id)
		}
	}
}
