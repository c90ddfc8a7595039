package breaker

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the breaker's only source of time. Production uses SystemClock;
// tests inject a FakeClock and never sleep to wait for a cooldown.
type Clock interface {
	Now() time.Time
}

// SystemClock reads the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Timer is a pending call made by AfterFunc.
type Timer interface {
	// Stop cancels the call; false when it already ran or was stopped.
	Stop() bool
}

// AfterFunc calls f once d has passed on c. A FakeClock runs f when it is
// advanced past the deadline, so that every timer of a lifecycle runs on
// the injected clock and tests never wait for a real one; any other clock
// uses time.AfterFunc.
func AfterFunc(c Clock, d time.Duration, f func()) Timer {
	if fc, ok := c.(*FakeClock); ok {
		return fc.AfterFunc(d, f)
	}
	return time.AfterFunc(d, f)
}

// FakeClock is a manually advanced clock, safe for concurrent use.
type FakeClock struct {
	ns atomic.Int64

	mu     sync.Mutex
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *FakeClock
	at   int64
	f    func()
	done bool // ran or stopped (under c.mu)
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

// AfterFunc calls f when the clock is advanced to d from now or past it,
// on the goroutine that advances it (in deadline order, after the clock
// moved).
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{c: c, at: c.ns.Load() + int64(d), f: f}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	if d <= 0 {
		c.fire()
	}
	return t
}

// Pending is how many timers wait on the clock (tests).
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

// fire runs every due timer, earliest first; a timer that a callback adds
// and that is already due runs too.
func (c *FakeClock) fire() {
	for {
		now := c.ns.Load()
		c.mu.Lock()
		var next *fakeTimer
		live := c.timers[:0]
		for _, t := range c.timers {
			if t.done {
				continue
			}
			live = append(live, t)
			if t.at <= now && (next == nil || t.at < next.at) {
				next = t
			}
		}
		c.timers = live
		if next == nil {
			c.mu.Unlock()
			return
		}
		next.done = true
		c.mu.Unlock()
		next.f()
	}
}

// NewFakeClock returns a FakeClock set to t.
func NewFakeClock(t time.Time) *FakeClock {
	c := &FakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Advance moves the clock forward by d and runs the timers it made due.
func (c *FakeClock) Advance(d time.Duration) {
	c.ns.Add(int64(d))
	c.fire()
}

// Set moves the clock to t and runs the timers it made due.
func (c *FakeClock) Set(t time.Time) {
	c.ns.Store(t.UnixNano())
	c.fire()
}

// CoarseClock is a wall clock read from memory, refreshed every resolution
// by one goroutine while it is being read. Breakers work in milliseconds and
// seconds, and on a virtual machine time.Now costs more than a whole
// decision (about 55 ns against 10 ns on the CI machine), so the request
// path reads this instead.
//
// It costs nothing while idle (R-L9): the refreshing ticker stops after
// idleAfter without a read, and the first read after that reads the system
// clock itself and wakes the ticker, so a value is never staler than the
// resolution.
type CoarseClock struct {
	// word is the time in unix ns with its two low bits used as flags:
	// bit 1 the ticker is refreshing it, bit 0 a read happened since the
	// last tick. One atomic load answers a read.
	word atomic.Int64
	wake chan struct{}
	stop chan struct{}
	once sync.Once
	res  time.Duration
	idle time.Duration
}

const (
	clkRead    = 1
	clkRunning = 2
	clkFlags   = clkRead | clkRunning
)

// NewCoarseClock starts a CoarseClock; Stop ends its goroutine.
func NewCoarseClock(resolution time.Duration) *CoarseClock {
	return newCoarseClock(resolution, time.Second)
}

func newCoarseClock(resolution, idleAfter time.Duration) *CoarseClock {
	c := &CoarseClock{wake: make(chan struct{}, 1), stop: make(chan struct{}), res: resolution, idle: idleAfter}
	c.word.Store(time.Now().UnixNano() &^ clkFlags)
	go c.run()
	return c
}

func (c *CoarseClock) run() {
	for {
		// Parked: no ticker, no wake-ups, until a read asks for one.
		select {
		case <-c.stop:
			return
		case <-c.wake:
		}
		t := time.NewTicker(c.res)
		quiet := time.Duration(0)
	ticking:
		for {
			select {
			case <-c.stop:
				t.Stop()
				return
			case now := <-t.C:
				old := c.word.Swap(now.UnixNano()&^clkFlags | clkRunning)
				if old&clkRead != 0 {
					quiet = 0
					continue
				}
				if quiet += c.res; quiet >= c.idle {
					break ticking
				}
			}
		}
		t.Stop()
		// Clear running unless a read marked the word since the last
		// tick; then keep ticking.
		for {
			w := c.word.Load()
			if w&clkRead != 0 {
				c.word.Store(w &^ clkRead)
				select {
				case c.wake <- struct{}{}:
				default:
				}
				break
			}
			if c.word.CompareAndSwap(w, w&^clkRunning) {
				break
			}
		}
	}
}

// Now returns the time of the last tick; after an idle spell, the system
// clock. The common case (ticking, already marked read) is one atomic load
// and small enough to inline.
func (c *CoarseClock) Now() time.Time {
	if w := c.word.Load(); w&clkFlags == clkFlags {
		return time.Unix(0, w&^clkFlags)
	}
	return c.slowNow()
}

func (c *CoarseClock) slowNow() time.Time {
	w := c.word.Load()
	if w&clkRunning != 0 {
		c.word.Or(clkRead) // once per tick: readers otherwise only load
		return time.Unix(0, w&^clkFlags)
	}
	now := time.Now()
	for {
		w = c.word.Load()
		if w&clkRunning != 0 {
			return now
		}
		if c.word.CompareAndSwap(w, now.UnixNano()&^clkFlags|clkRunning|clkRead) {
			select {
			case c.wake <- struct{}{}:
			default:
			}
			return now
		}
	}
}

// Exact reads the system clock without waking the ticker: for background
// work (the sweep) that must not keep an idle process ticking.
func (c *CoarseClock) Exact() time.Time { return time.Now() }

// Ticking reports whether the refreshing goroutine is awake (tests).
func (c *CoarseClock) Ticking() bool { return c.word.Load()&clkRunning != 0 }

// Stop ends the refreshing goroutine.
func (c *CoarseClock) Stop() { c.once.Do(func() { close(c.stop) }) }
