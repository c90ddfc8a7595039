package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The change log is how the periodic refresh costs one call per replica
// per period instead of one script per breaker (#27): every replica that
// sees a script change a breaker's decision state notes the breaker's key
// in a sorted set under a counter, and a refresh reads the counter, then
// only the keys noted since its last read.
//
// Both keys share one hash tag, so the note is one script on one Cluster
// slot. It is a separate call from the breaker's own script (a breaker's
// keys live in its own slot, and a script may not touch two slots), so a
// replica that dies between the two loses the note: the fleet then learns
// the change from the next outcome any replica records on that breaker
// (every script answer carries Redis's state), from the feed, or from the
// slow full refresh (Options.FullRefreshInterval). Like a feed message, a
// note is a hint, never a state: a forged one costs a read, nothing more.
//
//	<prefix>{changes}:meta  hash: epoch (random, set when the hash is
//	                        created), v (the counter), floor (notes at or
//	                        below it were trimmed)
//	<prefix>{changes}:log   sorted set: breaker key -> v of its last change
type changeLog struct {
	meta, log string

	mu      sync.Mutex
	pending map[string]struct{} // keys changed here, not yet noted
	// What the last refresh read: a counter from another epoch (the hash
	// was deleted, Redis restarted empty) or below the floor means the
	// notes in between are unknown, and the refresh reads every breaker.
	epoch string
	v     int64
}

func newChangeLog(prefix string) *changeLog {
	return &changeLog{meta: prefix + "{changes}:meta", log: prefix + "{changes}:log", pending: map[string]struct{}{}}
}

// maxChangeLog bounds the log: past it the oldest notes are trimmed and
// the floor raised, so a replica that slept through them reads everything.
const maxChangeLog = 1 << 16

// noteChanges adds keys to the log in one step and returns the counter.
// A (named arguments, R-ST16): epoch (a fresh one, taken when the log has
// none), keys.
var noteChanges = redis.NewScript(`
local max = ` + strconv.Itoa(maxChangeLog) + `
local A = cmsgpack.unpack(ARGV[1])
if redis.call('HSETNX', KEYS[1], 'epoch', A.epoch) == 1 then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'floor', 0)
end
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
for _, k in ipairs(A.keys) do redis.call('ZADD', KEYS[2], v, k) end
local n = redis.call('ZCARD', KEYS[2])
if n > max then
  local cut = redis.call('ZRANGE', KEYS[2], n - max - 1, n - max - 1, 'WITHSCORES')
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, n - max - 1)
  redis.call('HSET', KEYS[1], 'floor', cut[2])
end
return v
`)

// mark queues key's note; the publish loop writes it.
func (c *changeLog) mark(key string) {
	c.mu.Lock()
	c.pending[key] = struct{}{}
	c.mu.Unlock()
}

// take empties the pending set (at most max keys).
func (c *changeLog) take(max int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, min(len(c.pending), max))
	for k := range c.pending {
		if len(out) == max {
			break
		}
		out = append(out, k)
		delete(c.pending, k)
	}
	return out
}

// flush writes the pending notes; on failure they stay pending for the
// next round (a note is never dropped while the process lives).
func (s *Store) flushChanges(ctx context.Context) {
	for {
		keys := s.changes.take(1000)
		if len(keys) == 0 {
			return
		}
		var b [8]byte
		_, _ = rand.Read(b[:])
		a := msgpackMap(args{{"epoch", hex.EncodeToString(b[:])}, {"keys", keys}})
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := noteChanges.Run(cctx, s.rdb, []string{s.changes.meta, s.changes.log}, string(a)).Err()
		cancel()
		if err != nil {
			for _, k := range keys {
				s.changes.mark(k)
			}
			if ctx.Err() == nil {
				s.count("changes")
			}
			return
		}
	}
}

// changedSince reads the counter and, when it moved within the same epoch,
// the keys noted since the last read. all reports that the notes in
// between are unknown (another epoch, a counter gone back, the floor
// passed): every breaker must be read. commit records what was read, once
// the breakers it names were read.
func (s *Store) changedSince(ctx context.Context) (keys []string, all bool, commit func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	vals, err := s.rdb.HMGet(ctx, s.changes.meta, "epoch", "v", "floor").Result()
	if err != nil {
		return nil, false, nil, err
	}
	str := func(i int) string { v, _ := vals[i].(string); return v }
	epoch := str(0)
	v, _ := strconv.ParseInt(str(1), 10, 64)
	floor, _ := strconv.ParseInt(str(2), 10, 64)
	c := s.changes
	c.mu.Lock()
	lastEpoch, lastV := c.epoch, c.v
	c.mu.Unlock()
	commit = func() {
		c.mu.Lock()
		c.epoch, c.v = epoch, v
		c.mu.Unlock()
	}
	if epoch != lastEpoch || v < lastV || lastV < floor {
		return nil, true, commit, nil
	}
	if v == lastV {
		return nil, false, commit, nil
	}
	keys, err = s.rdb.ZRangeByScore(ctx, c.log, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(lastV, 10), Max: strconv.FormatInt(v, 10)}).Result()
	if err != nil {
		return nil, false, nil, err
	}
	return keys, false, commit, nil
}

// noteChange queues e's note and wakes the publish loop to write it.
func (s *Store) noteChange(e *entry) {
	s.changes.mark(e.key)
	select {
	case s.changed <- struct{}{}:
	default:
	}
}
