package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// The failure-count invariant (#36): a closed breaker's failure count
// never goes down without a close (a new generation), a window roll, or a
// state the run threw away on purpose (a fusebox restart on the memory
// store, Redis restarted empty or flushed: r.epoch). A stall that erased
// counts in Redis (before R-ST14) shows here as a drop within one
// generation.
//
// On Redis the count is read from Redis itself (every breaker state,
// with Redis's clock and the tumbling counter's end, so a roll is known
// exactly): a replica's admin API answers from its local view while Redis
// does not answer, and the local view holds only its own evidence. On the
// memory store it is the admin API's (the memory store is the store); the
// soak's tumbling counter lives 2 × window_sec = 20 s, so a drop is a roll
// only 20 s or more after the count was first seen above 0.

// countSample is one breaker's count at one moment.
type countSample struct {
	at         time.Time
	epoch      int64
	closed     bool
	failures   int
	generation uint64
	rolls      time.Time // when the count rolls (Redis only; zero: unknown)
}

// failCounts is what the sampler saw.
type failCounts struct {
	mu     sync.Mutex
	last   map[string]countSample
	streak map[string]time.Time // since when the count has been above 0
	drops  []string
	n      int
}

// soakWindow is the soak config's window_sec.
const soakWindow = 10 * time.Second

func (r *rig) sampleCounts(fc *failCounts) {
	epoch := r.epoch.Load()
	var got map[string]countSample
	if r.rdb != nil {
		got = r.redisCounts(epoch)
	} else {
		got = r.adminCounts(epoch)
	}
	if r.epoch.Load() != epoch {
		return // a restart or a flush ran meanwhile
	}
	for k, s := range got {
		fc.add(k, s)
	}
}

// redisCounts reads every breaker's state in Redis in one script: its
// state, generation, tumbling count and the count's end, and Redis's time.
func (r *rig) redisCounts(epoch int64) map[string]countSample {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	vals, err := r.rdb.Eval(ctx, `
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
for _, k in ipairs(redis.call('KEYS', 'soak:{*}:state')) do
  local ok, s = pcall(cmsgpack.unpack, redis.call('GET', k))
  if ok and type(s) == 'table' and s.schema == 2 then
    table.insert(out, k)
    table.insert(out, s.state or 0)
    table.insert(out, s.generation or 0)
    table.insert(out, s.tumbling_failures or 0)
    table.insert(out, s.tumbling_until or 0)
  end
end
return out`, nil).Slice()
	if err != nil || len(vals) == 0 {
		return nil
	}
	redisNow, _ := vals[0].(int64)
	at := time.UnixMilli(redisNow)
	out := map[string]countSample{}
	for i := 1; i+4 < len(vals); i += 5 {
		k, _ := vals[i].(string)
		st, _ := vals[i+1].(int64)
		gen, _ := vals[i+2].(int64)
		f, _ := vals[i+3].(int64)
		until, _ := vals[i+4].(int64)
		c := countSample{at: at, epoch: epoch, closed: st == 0, failures: int(f), generation: uint64(gen)}
		if until > 0 {
			c.rolls = time.UnixMilli(until)
		}
		out[k] = c
	}
	return out
}

// adminCounts reads every route's status from the primary replica.
func (r *rig) adminCounts(epoch int64) map[string]countSample {
	r.mu.Lock()
	in := r.fusebox
	r.mu.Unlock()
	if in == nil {
		return nil
	}
	resp, err := http.Get("http://" + in.AdminAddr() + "/admin/v1/gateways/default/routes")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var rows []struct {
		Route      string `json:"route"`
		State      string `json:"state"`
		Failures   int    `json:"failures"`
		Generation uint64 `json:"generation"`
	}
	if jsonDecode(resp.Body, &rows) != nil {
		return nil
	}
	out := map[string]countSample{}
	now := time.Now()
	for _, row := range rows {
		out[row.Route] = countSample{at: now, epoch: epoch, closed: row.State == "closed", failures: row.Failures, generation: row.Generation}
	}
	return out
}

func (fc *failCounts) add(k string, s countSample) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.last == nil {
		fc.last, fc.streak = map[string]countSample{}, map[string]time.Time{}
	}
	fc.n++
	prev, ok := fc.last[k]
	fc.last[k] = s
	since, streaking := fc.streak[k]
	if s.failures == 0 {
		delete(fc.streak, k)
	} else if !streaking || s.failures < prev.failures {
		fc.streak[k] = s.at
	}
	if !ok || prev.epoch != s.epoch || prev.generation != s.generation || !prev.closed || !s.closed || s.failures >= prev.failures {
		return
	}
	rolled := false
	if !prev.rolls.IsZero() {
		rolled = !s.at.Before(prev.rolls) // Redis: the counter's own end
	} else {
		rolled = streaking && s.at.Sub(since) >= 2*soakWindow-300*time.Millisecond
	}
	if !rolled {
		fc.drops = append(fc.drops, fmt.Sprintf("%s: %d -> %d failures in generation %d", k, prev.failures, s.failures, s.generation))
	}
}
