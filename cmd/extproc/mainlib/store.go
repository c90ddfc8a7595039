package mainlib

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/admin"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/routes/shared"
	"github.com/fusebox-llm/fusebox/pkg/transitions"
)

// storeWiring is the breaker store of store.backend, with what it needs
// started once fusebox serves.
type storeWiring struct {
	store breaker.Store
	// start runs the store's background work (the Redis replica view)
	// until ctx ends; nil for the memory store.
	start func(ctx context.Context) *sync.WaitGroup
	// overlays is where admin changes are kept (R-API2a).
	overlays routes.OverlayStore
	// shared: overlays live in a shared store that may be unreachable at
	// start; fusebox starts without them and loads them when it returns.
	shared bool
	close  func()
	// fleetKey is store.redis.hmac_key_file's key: it also seals the
	// attempt token every replica must open (R-X10); nil = none.
	fleetKey []byte
}

// storeDeps is what openStore wires the store to.
type storeDeps struct {
	log   *slog.Logger
	m     *metrics.Metrics
	h     *admin.Health
	rep   *transitions.Reporter
	clock breaker.Clock
	// replica names this replica to the fleet (the journal's name; the
	// access log line's fusebox.replica, R-FD5).
	replica string
	// testClock: clock is a test's (WithClock), which the Redis scripts
	// then take as their time instead of Redis's own
	// (redisstore.Options.TestClock).
	testClock bool
	// overlayCache is store.redis.overlay_cache's default path ("" = off).
	overlayCache func() string
	onOverlay    func(gateway string)
}

// openStore builds the store of cfg. The Redis store reports its
// readiness to the "store" health component: not ready until the first
// snapshot loads, degraded (still ready) while Redis is unreachable.
func openStore(cfg routes.StoreConfig, d storeDeps) (*storeWiring, error) {
	log, m, h := d.log, d.m, d.h
	if cfg.Backend != routes.StoreRedis {
		return &storeWiring{
			store: breaker.NewMemory(d.rep.Report),
			overlays: &routes.FileOverlays{Path: cfg.Memory.PersistPath, Log: log,
				OnCorrupt: func() { m.Refused.WithLabelValues(metrics.RefusedPersistCorrupt).Inc() }},
			close: func() {},
		}, nil
	}
	var key []byte
	if cfg.Redis.HMACKeyFile != "" {
		k, err := redisstore.ReadKeyFile(cfg.Redis.HMACKeyFile)
		if err != nil {
			return nil, err
		}
		key = k
	}
	cache := d.overlayCache()
	if cfg.Redis.OverlayCache != nil {
		cache = *cfg.Redis.OverlayCache
	}
	if cache == "" {
		log.Warn("[config] store.redis.overlay_cache is off: if Redis and every replica restart together (a Redis without persistence), acknowledged admin changes are lost")
	}
	client, err := redisstore.NewClient(cfg.Redis.URL)
	if err != nil {
		return nil, err
	}
	timeout := int64(routes.DefaultOpTimeoutMs)
	if cfg.Redis.OpTimeoutMs != nil {
		timeout = *cfg.Redis.OpTimeoutMs
	}
	h.Set("store", admin.Component{Detail: "redis: loading the first snapshot"})
	st := redisstore.New(redisstore.Options{
		Client: client, KeyPrefix: cfg.Redis.KeyPrefix, ReplicaID: d.replica, OpTimeout: time.Duration(timeout) * time.Millisecond,
		OnEvent: d.rep.Report, OnView: d.rep.View, AsyncRecord: true, Clock: d.clock, TestClock: d.testClock, Log: log,
		OnError:   func(op string) { m.StoreErrors.WithLabelValues(op).Inc() },
		OnOverlay: d.onOverlay, HMACKey: key,
		OnRefused: func(what string) { m.Refused.WithLabelValues(what).Inc() },
		OnAlive:   func(n int) { m.ReplicasAlive.Set(float64(n)) },
		OnHealth: func(ready, degraded bool, detail string) {
			h.Set("store", admin.Component{Ready: ready, Degraded: degraded, Detail: detail})
		},
	})
	return &storeWiring{fleetKey: key,
		store: st,
		start: st.Start,
		overlays: &shared.Overlays{Backend: &redisstore.Overlays{Store: st}, OnRestored: func(id string, rev int64) {
			log.Warn("[config] Redis had gone back to an older admin change (a failover to a replica without the last writes?) or was emptied: the one this replica knew was put back",
				"gateway", id, "revision", rev)
		},
			Cache: cache,
			OnCacheError: func(err error) {
				log.Warn("[config] the local overlay cache (store.redis.overlay_cache) failed", "error", err)
			}},
		shared: true,
		close:  func() { _ = client.Close() },
	}, nil
}
