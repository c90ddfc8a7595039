package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicas alive (R-FD2): the quorum for local evidence is capped at the
// replicas sharing the store, and only the store knows them. Each replica
// beats in one sorted set (member: its id, score: Redis's time of its last
// beat, so that no replica's clock matters) and reads how many beat within
// aliveFor. A replica that stops beating (gone, or cut off from Redis)
// leaves the count aliveFor later; one that stops cleanly leaves at once.

// beatEvery is how often a replica beats; aliveFor how long a beat counts.
const (
	beatEvery = 5 * time.Second
	aliveFor  = 3 * beatEvery
)

// beat adds this replica's beat, drops the beats older than aliveFor and
// answers how many are left, in one call. ARGV: the member, aliveFor in
// ms. The time is Redis's own, even under a test's clock: whether a
// process is alive is a matter of real time, and a test's clock (the
// simulation's, moved ahead a second per step) jumped past aliveFor
// between two replicas' beats, so each read the other as gone and its
// local failures counted for the fleet at once.
var beat = redis.NewScript(`
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZADD", KEYS[1], now, ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - tonumber(ARGV[2]))
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]) * 2)
return redis.call("ZCARD", KEYS[1])
`)

// membersKey is the set of replicas' beats, in a slot of its own.
func (s *Store) membersKey() string { return s.prefix + "{replicas}" }

// Alive is how many replicas shared the store at the last beat (this one
// included); 0 before the first.
func (s *Store) Alive() int { return int(s.alive.Load()) }

// beatIfDue beats when the last beat is beatEvery old, by the wall clock.
func (s *Store) beatIfDue(ctx context.Context) {
	wall := time.Now()
	if last := s.lastBeat.Load(); last != 0 && wall.Sub(time.Unix(0, last)) < s.beatInterval() {
		return
	}
	s.lastBeat.Store(wall.UnixNano())
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := beat.Run(ctx, s.rdb, []string{s.membersKey()}, s.origin, aliveFor.Milliseconds()).Int64()
	if err != nil {
		s.lastBeat.Store(0) // the next refresh tries again
		return
	}
	s.alive.Store(n)
	if s.opts.OnAlive != nil {
		s.opts.OnAlive(int(n))
	}
}

// beatInterval is beatEvery, or the refresh interval when that is
// shorter (tests).
func (s *Store) beatInterval() time.Duration { return min(beatEvery, s.opts.RefreshInterval) }

// leave removes this replica's beat: a replica that stops cleanly stops
// counting at once.
func (s *Store) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	_ = s.rdb.ZRem(ctx, s.membersKey(), s.origin).Err()
}
