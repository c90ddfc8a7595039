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
// ms, and (a test's clock) the time in ms, else Redis's own.
var beat = redis.NewScript(`
local now = tonumber(ARGV[3])
if now == nil then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
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

// beatIfDue beats when the last beat is beatEvery old (always in a test
// with TestClock, whose clock may stand still).
func (s *Store) beatIfDue(ctx context.Context) {
	wall := time.Now()
	if last := s.lastBeat.Load(); last != 0 && wall.Sub(time.Unix(0, last)) < s.beatInterval() {
		return
	}
	s.lastBeat.Store(wall.UnixNano())
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	argv := []any{s.origin, aliveFor.Milliseconds()}
	if s.opts.TestClock {
		argv = append(argv, s.opts.Clock.Now().UnixMilli())
	}
	n, err := beat.Run(ctx, s.rdb, []string{s.membersKey()}, argv...).Int64()
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
