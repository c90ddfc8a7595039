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

// maxBuckets bounds a sliding window's memory whatever its length: a
// window longer than maxBuckets seconds uses buckets wider than one second
// (R-W2 allows resolution no finer than 1 s). window_sec ≤ 86400 (R-P1)
// therefore costs at most maxBuckets × 16 bytes per breaker.
const maxBuckets = 120

// bucket is one slice of a sliding window.
type bucket struct {
	idx      int64 // bucket number: unix seconds / width; 0 = empty
	calls    int32
	failures int32
	slow     int32
}

// sliding keeps buckets over the last `size` seconds with running totals, so
// adding and reading are O(1) amortised (R-W2, R-T2, R-T4).
type sliding struct {
	buckets  []bucket
	sizeSec  int64
	width    int64 // seconds per bucket
	n        int64 // number of buckets
	totCalls int64
	totFails int64
	totSlow  int64
}

func newSliding(sizeSec int) sliding {
	if sizeSec < 1 {
		sizeSec = 1
	}
	width := (int64(sizeSec) + maxBuckets - 1) / maxBuckets
	n := (int64(sizeSec) + width - 1) / width
	return sliding{buckets: make([]bucket, n), sizeSec: int64(sizeSec), width: width, n: n}
}

func (s *sliding) drop(b *bucket) {
	s.totCalls -= int64(b.calls)
	s.totFails -= int64(b.failures)
	s.totSlow -= int64(b.slow)
	*b = bucket{}
}

// advance drops buckets that fell out of the window ending in bucket idx.
func (s *sliding) advance(idx int64) {
	for i := range s.buckets {
		b := &s.buckets[i]
		if b.idx != 0 && idx-b.idx >= s.n {
			s.drop(b)
		}
	}
}

// slot returns the bucket for idx, recycling a stale one.
func (s *sliding) slot(idx int64) *bucket {
	b := &s.buckets[idx%s.n]
	if b.idx != idx {
		if b.idx != 0 {
			s.drop(b)
		}
		b.idx = idx
	}
	return b
}

func (s *sliding) add(now int64, call, failure, slow bool) {
	idx := now / 1e9 / s.width
	s.expire(idx)
	b := s.slot(idx)
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

// expire drops old buckets. Scanning is bounded by the bucket count and only
// happens when the newest bucket is not the current one.
func (s *sliding) expire(idx int64) {
	if s.totCalls == 0 && s.totFails == 0 && s.totSlow == 0 {
		return
	}
	if s.buckets[idx%s.n].idx == idx {
		// This bucket exists; older ones were expired when it was created.
		return
	}
	s.advance(idx)
}

func (s *sliding) totals(now int64) (calls, failures, slow int64) {
	s.expire(now / 1e9 / s.width)
	return s.totCalls, s.totFails, s.totSlow
}

func (s *sliding) reset() {
	clear(s.buckets)
	s.totCalls, s.totFails, s.totSlow = 0, 0, 0
}

// resize changes the window length (a policy change, R-P9), keeping what
// still falls inside the new window. Buckets are re-filed by their start
// second; a shorter window drops the older ones at once.
func (s *sliding) resize(sizeSec int, now int64) {
	if int64(sizeSec) == s.sizeSec {
		return
	}
	old, oldWidth := s.buckets, s.width
	*s = newSliding(sizeSec)
	sec := now / 1e9
	for _, b := range old {
		if b.idx == 0 {
			continue
		}
		start := b.idx * oldWidth
		if sec-start >= s.sizeSec {
			continue
		}
		nb := s.slot(start / s.width)
		nb.calls += b.calls
		nb.failures += b.failures
		nb.slow += b.slow
		s.totCalls += int64(b.calls)
		s.totFails += int64(b.failures)
		s.totSlow += int64(b.slow)
	}
}
