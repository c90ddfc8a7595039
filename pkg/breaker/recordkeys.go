package breaker

import "hash/maphash"

// Keyed records (R-DL11): every real outcome travels with a key, the
// decision id and the attempt number, and a store applies a key at most once
// while any channel may still deliver it. A second record of the key (the
// observer's and the access log's of the same request, a resend after a lost
// answer, the same attempt claimed on two replicas) answers AlreadyApplied
// and changes nothing. Neithers travel without a key: they count nothing,
// and an expiry's neither must never make the real outcome that follows it
// a repeat (R-DL2).

// DefaultRecordKeyLife is how long a key is remembered when the record does
// not say (ms): the defaults' decision_wait_sec + access_log.wait_ms (302 s),
// with room for a resend after a short outage.
const DefaultRecordKeyLife = int64(600_000)

// maxRecordKeys bounds one breaker's remembered keys per generation (two
// generations are kept): 2^18 hashes in a table of at most 2^19 slots of 8
// bytes, 4 MiB per generation at the bound, which is some 870 records a
// second on one route for the default life. Past it a generation turns
// early and keys older than it are forgotten (a repeat of one of those
// would apply again); recordKeys.early counts how often.
const maxRecordKeys = 1 << 18

// recordSeed hashes record keys; one per process, so that keys are not
// chosen to collide by a sender.
var recordSeed = maphash.MakeSeed()

// hashRecordKey is the 64-bit hash a memory store remembers a key by (a
// collision between two live keys is about 2^-64 per pair). Never 0: the
// key sets use 0 for an empty slot.
func hashRecordKey(key string) uint64 { return maphash.String(recordSeed, key) | 1 }

// keySet is a set of nonzero hashes in one open-addressed table (linear
// probing, at most half full): 8 bytes a slot and nothing else, so that
// what it holds is known to the byte (RecordKeyBytes).
type keySet struct {
	slots []uint64
	n     int
}

func (s *keySet) has(h uint64) bool {
	if len(s.slots) == 0 {
		return false
	}
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case h:
			return true
		case 0:
			return false
		}
	}
}

func (s *keySet) add(h uint64) {
	if 2*(s.n+1) > len(s.slots) {
		old := s.slots
		s.slots = make([]uint64, max(64, 2*len(old)))
		s.n = 0
		for _, x := range old {
			if x != 0 {
				s.add(x)
			}
		}
	}
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case h:
			return
		case 0:
			s.slots[i] = h
			s.n++
			return
		}
	}
}

func (s *keySet) bytes() int64 { return 8 * int64(cap(s.slots)) }

// recordKeys remembers the keys one breaker applied: two generations, each
// at most maxRecordKeys, turned when the current one is older than the
// longest life asked for. A key lives at least its life and at most twice
// that. Guarded by its machine's mu.
type recordKeys struct {
	cur, prev keySet
	since     int64 // when cur began (ns)
	life      int64 // the longest life asked for (ns)
	early     int   // generations turned because cur was full
}

// seen reports whether key was applied within its life, and remembers it
// when it was not.
func (k *recordKeys) seen(key string, lifeMs int64, now int64) bool {
	if lifeMs <= 0 {
		lifeMs = DefaultRecordKeyLife
	}
	if l := lifeMs * 1e6; l > k.life {
		k.life = l
	}
	if k.cur.n == 0 && k.prev.n == 0 {
		k.since = now
	}
	switch {
	case now-k.since >= 2*k.life:
		// Both generations are past every life: forget them.
		k.prev, k.cur, k.since = keySet{}, keySet{}, now
	case now-k.since >= k.life:
		k.prev, k.cur, k.since = k.cur, keySet{}, now
	}
	h := hashRecordKey(key)
	if k.cur.has(h) || k.prev.has(h) {
		return true
	}
	if k.cur.n >= maxRecordKeys {
		k.prev, k.cur, k.since = k.cur, keySet{}, now
		k.early++
	}
	k.cur.add(h)
	return false
}

// bytes is what the remembered keys hold.
func (k *recordKeys) bytes() int64 { return k.cur.bytes() + k.prev.bytes() }

// RecordKeyBytes is what the memory store's remembered record keys hold
// (R-DL11): kept for their life whatever the traffic does, so a measure of
// what a load left behind (the soak's) counts them apart, as it counts a
// connection pool.
func (s *Memory) RecordKeyBytes() int64 {
	var n int64
	for _, m := range s.tab.Load().slots {
		if m != nil {
			m.mu.Lock()
			n += m.keys.bytes()
			m.mu.Unlock()
		}
	}
	return n
}
