package routes

import (
	"context"
	"sync"
)

// Refresher runs Manager.Refresh off the caller's goroutine. The shared
// store's feed reader tells it that another replica changed an overlay; the
// reader must never wait on an admin change holding the manager's lock (R-L11),
// so a notice only marks a refresh due, and notices that arrive while one
// runs fold into the next.
type Refresher struct {
	Manager *Manager
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

// Run refreshes once per due mark until ctx ends.
func (r *Refresher) Run(ctx context.Context) {
	r.init()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.due:
			if err := r.Manager.Refresh(ctx); err != nil && r.OnError != nil && ctx.Err() == nil {
				r.OnError(err)
			}
		}
	}
}
