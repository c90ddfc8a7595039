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
		return redis.NewFailoverClient(o), nil
	case q.Has("addr"):
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("store.redis.url (cluster): %w", err)
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClusterClient(o), nil
	}
	o, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, fmt.Errorf("store.redis.url: %w", err)
	}
	o.ContextTimeoutEnabled = true
	return redis.NewClient(o), nil
}

// go-redis prints its own unstructured lines to stderr (a failed dial, a
// pool retry) on every attempt while Redis is down. The store logs an
// outage once, structured, and counts every failed operation
// (aig_store_errors_total), so those lines are dropped.
var quietOnce sync.Once

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
