package mainlib

import "context"

// component is one part of a running fusebox that must be stopped: the
// clock, the store, a listener, a server, a background loop. start, when
// set, starts it and returns once it runs (its work goes on in goroutines
// of its own); stop ends it and returns once it has ended.
type component struct {
	name  string
	start func()
	stop  func()
}

// components starts components in the order Start lists them and stops
// those started in the reverse order, once: what serves stops first (the
// ext_proc server: once its streams are done nothing records any more),
// then what it used (the loops, the store's workers, which write what is
// still queued, R-ST8), and what was opened first stops last. A Start that
// fails half-way stops what it had started the same way.
//
// Why not github.com/oklog/run (Prometheus, Thanos): it interrupts every
// actor at once when one returns; fusebox's drain needs an order, and the
// servers' own errors reach Wait through serveErr.
type components struct {
	started []component
}

// add starts each of cs in order and keeps it to be stopped.
func (g *components) add(cs ...component) {
	for _, c := range cs {
		if c.start != nil {
			c.start()
		}
		g.started = append(g.started, c)
	}
}

// stop stops what was started, last first.
func (g *components) stop() {
	for i := len(g.started) - 1; i >= 0; i-- {
		if s := g.started[i].stop; s != nil {
			s()
		}
	}
	g.started = nil
}

// loop is a component that runs fn in a goroutine of its own until it is
// stopped (fn returns when its context ends).
func loop(name string, fn func(ctx context.Context)) component {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	return component{
		name:  name,
		start: func() { go func() { defer close(done); fn(ctx) }() },
		stop:  func() { cancel(); <-done },
	}
}
