package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

func (s *Store) count(op string) {
	if s.opts.OnError != nil {
		s.opts.OnError(op)
	}
}

// failed counts a failed Redis operation and turns the store degraded:
// decisions and recording continue on the local view, logged once until
// Redis is back (R-ST4).
func (s *Store) failed(op string, err error) {
	s.count(op)
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		// go-redis reloads a Cluster's slot map on MOVED, or every 60 s;
		// a connection error to a master that failed (its replica now
		// promoted) reloads nothing, so every call of its slots, and the
		// feed's resubscription, would go on dialling the dead master for
		// up to a minute. The reload is asynchronous and coalesced.
		cc.ReloadState(context.Background())
	}
	s.lines.Lock()
	from, _ := s.sync.step(callFailed)
	began := from != degraded && from != writingBack
	if began {
		s.log.Error("[store] Redis is unreachable: deciding and recording on this replica's local state until it returns",
			"op", op, "error", err.Error())
	}
	s.lines.Unlock()
	if began {
		s.health()
	}
}

// health reports the store's readiness when it changed.
func (s *Store) health() {
	if s.opts.OnHealth == nil {
		return
	}
	// Serialised, and the flags read inside: the last report is always
	// the current state.
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	code := int32(1)
	if s.ready.Load() {
		code |= 2
	}
	if s.sync.localIsTheStore() {
		code |= 4
	}
	if s.lastHealth.Swap(code) == code {
		return
	}
	switch {
	case s.sync.localIsTheStore():
		s.opts.OnHealth(s.ready.Load(), true, "redis unreachable: deciding on local state")
	case s.ready.Load():
		s.opts.OnHealth(true, false, "redis")
	default:
		s.opts.OnHealth(false, false, "redis: loading the first snapshot")
	}
}

// refused drops a message or document for its signature: counted, and
// logged at most once a minute (a writer could send thousands).
func (s *Store) refused(what, msg string) {
	if s.opts.OnRefused != nil {
		s.opts.OnRefused(what)
	}
	now := time.Now().Unix()
	if last := s.unsignedLogged.Load(); now-last >= 60 && s.unsignedLogged.CompareAndSwap(last, now) {
		s.log.Error(msg, "what", what)
	}
}

func (s *Store) markReady() {
	s.ready.Store(true)
	s.health()
}

func (s *Store) reachable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.rdb.Ping(ctx).Err() == nil
}
