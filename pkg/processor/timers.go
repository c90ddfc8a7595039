package processor

import (
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// timerSet is every pending call the server armed: a decision's wait (up
// to decision_wait_sec, 300 s by default), its rechecks and re-parks, a
// parked attempt's expiry, a broken answer's label wait. Stop ends them
// all when fusebox stops: a stopped fusebox's decisions are left to their
// notes, which outlive it in the store, and no timer keeps the stopped
// server (its stream tables, its store) alive. Before, the fleet soak's
// memory check found two of ten restarted fuseboxes still held (7.5 MiB,
// their Redis stores' record queues) by decisions waiting out their 300 s.
type timerSet struct {
	mu      sync.Mutex
	live    map[*setTimer]struct{}
	stopped bool
}

// setTimer is one call of a timerSet.
type setTimer struct {
	set *timerSet
	t   breaker.Timer // nil until armed (under set.mu)
}

// after calls f once d has passed on c, unless the set is stopped first.
func (ts *timerSet) after(c breaker.Clock, d time.Duration, f func()) breaker.Timer {
	st := &setTimer{set: ts}
	ts.mu.Lock()
	if ts.stopped {
		ts.mu.Unlock()
		return st
	}
	if ts.live == nil {
		ts.live = map[*setTimer]struct{}{}
	}
	ts.live[st] = struct{}{}
	ts.mu.Unlock()
	// Armed outside the lock: a fake clock may run a due call at once.
	t := breaker.AfterFunc(c, d, func() {
		if ts.take(st) {
			f()
		}
	})
	ts.mu.Lock()
	_, live := ts.live[st]
	if live {
		st.t = t
	}
	ts.mu.Unlock()
	if !live {
		t.Stop() // ran already, or the set stopped: let go of f either way
	}
	return st
}

// take removes st from the set; false when it was not there (stopped).
func (ts *timerSet) take(st *setTimer) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	_, live := ts.live[st]
	delete(ts.live, st)
	return live
}

// Stop cancels the call; false when it already ran or was stopped.
func (st *setTimer) Stop() bool {
	ts := st.set
	ts.mu.Lock()
	_, live := ts.live[st]
	delete(ts.live, st)
	t := st.t
	ts.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	return live
}

// stop cancels every call and every later one.
func (ts *timerSet) stop() {
	ts.mu.Lock()
	ts.stopped = true
	var ts2 []breaker.Timer
	for st := range ts.live {
		if st.t != nil {
			ts2 = append(ts2, st.t)
		}
	}
	ts.live = nil
	ts.mu.Unlock()
	for _, t := range ts2 {
		t.Stop()
	}
}

// pending is how many calls wait (tests read it).
func (ts *timerSet) pending() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.live)
}

// Stop ends every pending call the server armed (timerSet). fusebox calls
// it once its ext_proc server stopped: decisions still waiting are left to
// their notes in the store, where any replica's channel can settle them.
func (s *Server) Stop() { s.timers.stop() }
