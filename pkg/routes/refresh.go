package routes

import (
	"context"
	"sync"
	"time"
)

// Refresher runs Manager.Refresh off the caller's goroutine. The shared
// store's feed reader tells it that another replica changed an overlay; the
// reader must never wait on an admin change holding the manager's lock (R-L11),
// so a notice only marks a refresh due, and notices that arrive while one
// runs fold into the next.
type Refresher struct {
	Manager *Manager
	// Every, when set, also refreshes that often: a notice lost on the feed
	// (a failed publish, a dropped subscription) or a store that lost its
	// overlays is repaired within it (R-ST9). An unchanged set costs one
	// read and puts nothing in force.
	Every time.Duration
	// OnError is told when a refresh failed (the next notice or the
	// store's resync retries it).
	OnError func(error)

	once sync.Once
	due  chan struct{}
}

func (r *Refresher) init() { r.once.Do(func() { r.due = make(chan struct{}, 1) }) }

// Notify marks a refresh due. It never blocks.
func (r *Refresher) Notify() {
	r.init()
	select {
	case r.due <- struct{}{}:
	default: // one is due already: it will read this change too
	}
}

// Run refreshes once per due mark, and every Every, until ctx ends.
func (r *Refresher) Run(ctx context.Context) {
	r.init()
	var tick <-chan time.Time
	if r.Every > 0 {
		t := time.NewTicker(r.Every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.due:
		case <-tick:
		}
		if err := r.Manager.Refresh(ctx); err != nil && r.OnError != nil && ctx.Err() == nil {
			r.OnError(err)
		}
	}
}
