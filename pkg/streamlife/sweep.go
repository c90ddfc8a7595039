package streamlife

import (
	"sync"
	"time"
)

// Sweep is the set of streams on fusebox's own transport whose bounds
// (R-L13) one sweep checks, where each stream had a timer of its own
// before: a timer set and stopped per stream (its closure, the runtime's
// timer heap) for bounds that almost no stream reaches. The sweep runs
// while the set holds a stream, every sweepPeriod of the check period,
// and checks each stream whose check is due, so a bound is seen at most a
// sweep period late (a second at most; the default idle bound's check
// is 90 s). Adding and removing a stream is a list link under one lock.
type Sweep struct {
	mu      sync.Mutex
	head    *lifetime
	n       int
	timer   *time.Timer
	period  time.Duration // the sweep's; set by the first add
	running bool
	due     []*lifetime // the sweep's scratch list
}

// sweepPeriod is the sweep's period for a check period: an eighth of it,
// between a millisecond and a second.
func sweepPeriod(check time.Duration) time.Duration {
	return min(max(check/8, time.Millisecond), time.Second)
}

func (ls *Sweep) add(l *lifetime) {
	l.next = l.start.Add(l.check)
	ls.mu.Lock()
	l.nextL = ls.head
	if ls.head != nil {
		ls.head.prev = l
	}
	ls.head = l
	ls.n++
	if !ls.running {
		ls.running = true
		if ls.timer == nil {
			ls.period = sweepPeriod(l.check)
			ls.timer = time.AfterFunc(ls.period, ls.sweep)
		} else {
			ls.timer.Reset(ls.period)
		}
	}
	ls.mu.Unlock()
}

// remove takes l out of the set once its stream ended: a sweep that is
// about to end it sees it ended, and counts nothing.
func (ls *Sweep) remove(l *lifetime) {
	l.mu.Lock()
	l.ended = true
	l.mu.Unlock()
	ls.mu.Lock()
	if l.prev != nil {
		l.prev.nextL = l.nextL
	} else if ls.head == l {
		ls.head = l.nextL
	}
	if l.nextL != nil {
		l.nextL.prev = l.prev
	}
	l.prev, l.nextL = nil, nil
	ls.n--
	ls.mu.Unlock()
}

// sweep checks the streams whose check is due, and runs again after a
// period while any stream is left. A stopped sweep holds nothing: a
// Server with no stream is not kept alive by its timer.
func (ls *Sweep) sweep() {
	now := time.Now()
	ls.mu.Lock()
	due := ls.due[:0]
	for l := ls.head; l != nil; l = l.nextL {
		if !now.Before(l.next) {
			due = append(due, l)
		}
	}
	ls.mu.Unlock()
	// Checked outside the set's lock: ending a stream writes to its
	// connection, which must not hold up the streams that start and end.
	// And not on the sweep: a connection whose peer stopped reading holds
	// its writers until its write deadline, and the sweep ending one of
	// its streams waited with them, so every other connection's bounds
	// were seen that much later (idle streams with a 5 s bound ended after
	// 103 s, #50). Each end runs on its own; ended is set first, so no
	// sweep ends a stream twice.
	for i, l := range due {
		l.mu.Lock()
		if !l.ended {
			if next, err := l.due(); err != nil {
				l.ended = true
				go l.end(err)
			} else {
				l.next = now.Add(next)
			}
		}
		l.mu.Unlock()
		due[i] = nil
	}
	ls.mu.Lock()
	ls.due = due[:0]
	if ls.n > 0 {
		ls.timer.Reset(ls.period)
	} else {
		ls.running = false
	}
	ls.mu.Unlock()
}

// Idle reports whether the sweep has stopped with no stream left.
func (ls *Sweep) Idle() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return !ls.running && ls.n == 0 && ls.head == nil
}
