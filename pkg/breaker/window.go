package breaker

// tumbling is the R-W1 failure counter: created by the first failure with a
// lifetime of exactly 2 × window_sec, never extended; at expiry the count
// returns to 0 in one step.
type tumbling struct {
	count     int
	expiresAt int64 // unix ns; 0 = no counter
}

func (t *tumbling) current(now int64) int {
	if t.expiresAt != 0 && now >= t.expiresAt {
		t.count, t.expiresAt = 0, 0
	}
	return t.count
}

func (t *tumbling) add(now int64, windowSec int) int {
	if t.current(now) == 0 {
		t.expiresAt = now + 2*int64(windowSec)*1e9
	}
	t.count++
	return t.count
}

// bucket is one second of a sliding window.
type bucket struct {
	sec      int64
	calls    int32
	failures int32
	slow     int32
}

// sliding keeps per-second buckets over the last `size` seconds with running
// totals, so adding and reading are O(1) amortised (R-W2, R-T2, R-T4).
type sliding struct {
	buckets  []bucket
	size     int64
	totCalls int64
	totFails int64
	totSlow  int64
}

func newSliding(sizeSec int) sliding {
	if sizeSec < 1 {
		sizeSec = 1
	}
	return sliding{buckets: make([]bucket, sizeSec), size: int64(sizeSec)}
}

// advance drops buckets that fell out of the window ending at sec.
func (s *sliding) advance(sec int64) {
	for i := range s.buckets {
		b := &s.buckets[i]
		if b.sec != 0 && sec-b.sec >= s.size {
			s.totCalls -= int64(b.calls)
			s.totFails -= int64(b.failures)
			s.totSlow -= int64(b.slow)
			*b = bucket{}
		}
	}
}

// slot returns the bucket for sec, recycling a stale one.
func (s *sliding) slot(sec int64) *bucket {
	b := &s.buckets[sec%s.size]
	if b.sec != sec {
		if b.sec != 0 {
			s.totCalls -= int64(b.calls)
			s.totFails -= int64(b.failures)
			s.totSlow -= int64(b.slow)
		}
		*b = bucket{sec: sec}
	}
	return b
}

func (s *sliding) add(now int64, call, failure, slow bool) {
	sec := now / 1e9
	s.expire(sec)
	b := s.slot(sec)
	if call {
		b.calls++
		s.totCalls++
	}
	if failure {
		b.failures++
		s.totFails++
	}
	if slow {
		b.slow++
		s.totSlow++
	}
}

// expire drops old buckets. Scanning is bounded by the window size and only
// happens when a second has passed since the newest bucket (lastSec cache).
func (s *sliding) expire(sec int64) {
	if s.totCalls == 0 && s.totFails == 0 && s.totSlow == 0 {
		return
	}
	newest := s.buckets[sec%s.size].sec
	if newest == sec {
		// This second's bucket exists; older ones were expired when it
		// was created.
		return
	}
	s.advance(sec)
}

func (s *sliding) totals(now int64) (calls, failures, slow int64) {
	s.expire(now / 1e9)
	return s.totCalls, s.totFails, s.totSlow
}

func (s *sliding) reset() {
	clear(s.buckets)
	s.totCalls, s.totFails, s.totSlow = 0, 0, 0
}

// resize changes the window length (a policy change, R-P9), keeping the
// buckets that still fall inside it.
func (s *sliding) resize(sizeSec int, now int64) {
	if int64(sizeSec) == s.size {
		return
	}
	old := s.buckets
	*s = newSliding(sizeSec)
	sec := now / 1e9
	for _, b := range old {
		if b.sec != 0 && sec-b.sec < s.size {
			nb := s.slot(b.sec)
			*nb = b
			s.totCalls += int64(b.calls)
			s.totFails += int64(b.failures)
			s.totSlow += int64(b.slow)
		}
	}
}
