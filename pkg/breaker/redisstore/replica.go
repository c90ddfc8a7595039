package redisstore

import (
	"context"
	"sync"
	"time"
)

// Start runs the replica machinery until ctx ends: the record workers, the
// transition feed (subscriber and publisher) and the periodic refresh, which
// loads the first snapshot (the store is not ready before it), resyncs
// after a reconnect, and writes local opens back after an outage. It
// returns at once; Wait-free: the goroutines end with ctx.
func (s *Store) Start(ctx context.Context) *sync.WaitGroup {
	var wg, recs sync.WaitGroup
	for i := range s.rec {
		wg.Add(1)
		recs.Add(1)
		go func() { defer wg.Done(); defer recs.Done(); s.recordLoop(ctx, i) }()
	}
	s.started.Store(true)
	wg.Add(4)
	go func() { defer wg.Done(); s.hintLoop(ctx) }()
	go func() { defer wg.Done(); s.publishLoop(ctx, &recs) }()
	go func() { defer wg.Done(); s.subscribeLoop(ctx) }()
	go func() { defer wg.Done(); s.refreshLoop(ctx) }()
	return &wg
}

// Ready reports whether the first snapshot has loaded (or Redis was found
// unreachable, and the replica decides on its own: R-ST4).
func (s *Store) Ready() bool { return s.ready.Load() }

// Degraded reports whether Redis is unreachable and the local view is the
// store.
func (s *Store) Degraded() bool { return s.sync.localIsTheStore() }

// Origin is this replica's id on the feed.
func (s *Store) Origin() string { return s.origin }

func (s *Store) refreshLoop(ctx context.Context) {
	t := time.NewTicker(s.opts.RefreshInterval)
	defer t.Stop()
	for {
		s.Refresh(ctx)
		if !s.sync.localIsTheStore() {
			s.beatIfDue(ctx)
		}
		select {
		case <-ctx.Done():
			s.leave()
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}
