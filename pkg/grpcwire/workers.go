package grpcwire

import (
	"sync"
	"sync/atomic"
)

// pool is the process's one pool: the transport's streams and the
// processor's lifetime watch share it. It belongs to no server, so an idle
// worker keeps nothing alive (a pool inside a server kept that server, and
// all it holds, after a restart: the soak's memory invariant).
var pool Workers

// Go runs f on a reused goroutine of the process's pool (Workers).
func Go(f func()) { pool.Go(f) }

// Workers runs functions on reused goroutines. A new goroutine starts
// with a small stack, and growing it for fusebox's stream handler was a
// tenth of the observer's CPU (pprof under make bench-wire); a reused one
// keeps the stack it grew. The zero value is ready; at most MaxIdle
// (256 if 0) wait for work, the rest end when theirs is done.
type Workers struct {
	MaxIdle int32

	once sync.Once
	work chan func()
	quit chan struct{}
	stop sync.Once
	idle atomic.Int32
	// started counts the goroutines Go started (tests read it).
	started atomic.Int32
}

func (w *Workers) init() {
	w.once.Do(func() {
		w.work = make(chan func())
		w.quit = make(chan struct{})
	})
}

// Go runs f on an idle worker, or a new one.
func (w *Workers) Go(f func()) {
	w.init()
	select {
	case w.work <- f:
	default:
		w.started.Add(1)
		go w.run(f)
	}
}

func (w *Workers) run(f func()) {
	maxIdle := w.MaxIdle
	if maxIdle <= 0 {
		maxIdle = 256
	}
	for {
		f()
		if w.idle.Add(1) > maxIdle {
			w.idle.Add(-1)
			return
		}
		select {
		case f = <-w.work:
			w.idle.Add(-1)
		case <-w.quit:
			w.idle.Add(-1)
			return
		}
	}
}

// Stop ends the idle workers (Go still works after it, on new goroutines
// that end with their work).
func (w *Workers) Stop() {
	w.init()
	w.stop.Do(func() { close(w.quit) })
}
