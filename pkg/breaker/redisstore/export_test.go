package redisstore

// Quiet reports whether this replica holds nothing Redis has not answered:
// no queued record, no pending or unsent outcome on any breaker, and the
// store not degraded. The robustness checker reads Redis only then.
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
	return true
}
