package redisstore

import "context"

// Quiet reports whether this replica holds nothing Redis has not answered:
// no queued record, no pending or unsent outcome on any breaker, no
// write-back on its way, and the store not degraded. The robustness
// checker reads Redis only then.
func (s *Store) Quiet() bool {
	if s.Degraded() {
		return false
	}
	for i := range s.rec {
		if len(s.rec[i]) > 0 {
			return false
		}
		o := &s.over[i]
		o.mu.Lock()
		n := len(o.jobs)
		o.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	for _, e := range s.tab.Load().list {
		e.viewMu.Lock()
		busy := len(e.fl.pending) > 0 || len(e.fl.unsent) > 0
		e.viewMu.Unlock()
		if busy {
			return false
		}
	}
	// Read after the lists: a write-back that took a list is counted
	// before it took it.
	return s.writingBack.Load() == 0
}

// BeatNow beats at once, whenever the last beat was.
func (s *Store) BeatNow(ctx context.Context) {
	s.lastBeat.Store(0)
	s.beatIfDue(ctx)
}
