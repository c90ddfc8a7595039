package redisstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// NewClient returns a client for a store URL (store.redis.url):
//   - redis://[user:pass@]host:port/db, or rediss:// for TLS: one server;
//   - ...?addrs=host2:port,host3:port (or repeated addr=): a Redis Cluster
//     seeded with every address;
//   - ...?master_name=NAME[&addr=...]: Sentinel, failing over to the
//     master Sentinel names.
//
// Every form gives a redis.UniversalClient, so the store does not care
// which one runs. Every form sets ContextTimeoutEnabled: without it go-redis
// v9 does not put a call's context deadline on the socket, and a Redis that
// is connected but not answering (a fork, a failover, CLIENT PAUSE) held a
// call for its whole stall whatever op_timeout_ms said (R-ST7).
func NewClient(raw string) (redis.UniversalClient, error) {
	quietOnce.Do(func() { redis.SetLogger(quiet{}) })
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("store.redis.url: %w", err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("store.redis.url: must be redis:// or rediss://, got %q", u.Scheme)
	}
	q := u.Query()
	if addrs := q.Get("addrs"); addrs != "" {
		// SPEC's spelling; go-redis reads repeated addr= parameters.
		q.Del("addrs")
		for _, a := range strings.Split(addrs, ",") {
			if a = strings.TrimSpace(a); a != "" {
				q.Add("addr", a)
			}
		}
		u.RawQuery = q.Encode()
	}
	switch {
	case q.Has("master_name"):
		o, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("store.redis.url (sentinel): %w", err)
		}
		o.ContextTimeoutEnabled = true
		o.MaxIdleConns = maxIdle(q, o.MaxIdleConns)
		return redis.NewFailoverClient(o), nil
	case q.Has("addr"):
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("store.redis.url (cluster): %w", err)
		}
		o.ContextTimeoutEnabled = true
		o.MaxIdleConns = maxIdle(q, o.MaxIdleConns)
		return redis.NewClusterClient(o), nil
	}
	o, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("store.redis.url: %w", err)
	}
	o.ContextTimeoutEnabled = true
	o.MaxIdleConns = maxIdle(q, o.MaxIdleConns)
	return redis.NewClient(o), nil
}

// IdleConns is how many idle connections a replica keeps to each Redis
// server, unless the URL says otherwise (max_idle_conns). go-redis's own
// default keeps every connection a burst opened, up to pool_size (10 a
// core), for 30 minutes: a fleet of replicas on 16-core nodes held 160
// connections each against Redis's maxclients, and a replica's memory
// followed the largest burst it ever met (64 KiB of buffers a
// connection). A replica's steady use is its record workers
// (recordWorkers), the refresh, the feed's publisher and the journal's
// writer; the pool still opens up to pool_size for a burst and closes, as
// they come back, what the burst opened beyond this. (Not min_idle_conns
// as well: go-redis then dials a new connection each time one is taken and
// closes the warm one when it comes back, a handshake for every call.)
const IdleConns = 8

// maxIdle is the idle bound: the URL's when it sets one, else IdleConns.
func maxIdle(q url.Values, parsed int) int {
	if q.Has("max_idle_conns") {
		return parsed
	}
	return IdleConns
}

// go-redis prints its own unstructured lines to stderr (a failed dial, a
// pool retry) on every attempt while Redis is down. The store logs an
// outage once, structured, and counts every failed operation
// (aig_store_errors_total), so those lines are dropped.
var quietOnce sync.Once

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// PoolBuffers says how many connections the store's client holds to Redis
// and what their read and write buffers take: memory that follows the
// pool's size, bounded by pool_size and, idle, by IdleConns (a soak's
// memory check counts it apart, as it closes idle HTTP connections).
func (s *Store) PoolBuffers() (conns int, bytes int64) {
	st := s.rdb.PoolStats()
	per := int64(2 * 32 << 10) // go-redis's default buffer sizes
	if c, ok := s.rdb.(*redis.Client); ok {
		per = int64(c.Options().ReadBufferSize + c.Options().WriteBufferSize)
	}
	return int(st.TotalConns), int64(st.TotalConns) * per
}

// RecordKeyBytes is what this replica's view remembers of record keys
// (R-DL11; breaker.Memory.RecordKeyBytes): Redis keeps its own.
func (s *Store) RecordKeyBytes() int64 { return s.local.RecordKeyBytes() }

// Backlog is what the store still owes Redis: outcomes sent and not yet
// answered (pending), and outcomes Redis did not take, kept to send
// before the next resync (unsent), over every breaker, with the capacity
// their slices hold. After a load with Redis healthy both drain to 0.
func (s *Store) Backlog() (pending, unsent, capacity int) {
	for _, e := range s.tab.Load().list {
		e.viewMu.Lock()
		pending += len(e.fl.pending)
		unsent += len(e.fl.unsent)
		capacity += cap(e.fl.pending) + cap(e.fl.unsent)
		e.viewMu.Unlock()
	}
	return pending, unsent, capacity
}
