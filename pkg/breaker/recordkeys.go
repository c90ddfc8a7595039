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
// generations are kept): 2^18 hashes of 16 bytes and their map overhead,
// about 10 MiB per breaker at the bound, which is some 870 records a second
// on one route for the default life. Past it a generation turns early and
// keys older than it are forgotten (a repeat of one of those would apply
// again); recordKeys.early counts how often.
const maxRecordKeys = 1 << 18

// recordSeed hashes record keys; one per process, so that keys are not
// chosen to collide by a sender.
var recordSeed = maphash.MakeSeed()

// hashRecordKey is the 64-bit hash a memory store remembers a key by (a
// collision between two live keys is about 2^-64 per pair).
func hashRecordKey(key string) uint64 { return maphash.String(recordSeed, key) }

// recordKeys remembers the keys one breaker applied: two generations, each
// at most maxRecordKeys, turned when the current one is older than the
// longest life asked for. A key lives at least its life and at most twice
// that. Guarded by its machine's mu.
type recordKeys struct {
	cur, prev map[uint64]struct{}
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
	if k.cur == nil {
		k.cur, k.since = make(map[uint64]struct{}), now
	}
	switch {
	case now-k.since >= 2*k.life:
		// Both generations are past every life: forget them.
		k.prev, k.cur, k.since = nil, make(map[uint64]struct{}), now
	case now-k.since >= k.life:
		k.prev, k.cur, k.since = k.cur, make(map[uint64]struct{}), now
	}
	h := hashRecordKey(key)
	if _, ok := k.cur[h]; ok {
		return true
	}
	if _, ok := k.prev[h]; ok {
		return true
	}
	if len(k.cur) >= maxRecordKeys {
		k.prev, k.cur, k.since = k.cur, make(map[uint64]struct{}), now
		k.early++
	}
	k.cur[h] = struct{}{}
	return false
}
