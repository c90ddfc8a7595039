package redisstore

import (
	"sync"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// view is one breaker's view on this replica (R-ST13): Redis's last
// answer, which the local view (the embedded memory store) holds, with
// this replica's own evidence Redis has not answered on top of it. An
// answer goes under that evidence, never over it (apply).
type view struct {
	// viewMu makes compare-and-restore one step, and guards the rest.
	viewMu sync.Mutex
	// seq is the view sequence of the state the local view holds, of the
	// key's incarnation inc.
	seq uint64
	inc string
	// fl is this replica's evidence Redis has not answered (inflight.go).
	fl inflight
}

// apply puts a state from Redis into the local view when it is newer than
// what the view holds: a later sequence of the same incarnation of the key,
// or any state of another incarnation (the key vanished and came back; its
// sequence started again, R-ST8).
//
// The view is that state under this replica's unanswered outcomes (R-ST13,
// inflight.go): while a failure is unanswered, an answer that would make
// the view healthier than its own evidence made it is not taken (it was
// sent before that evidence); the answer to the last of them is.
func (s *Store) apply(e *entry, inc string, seq uint64, snap breaker.Snapshot, a answer) {
	if a.kind == answerResync {
		return
	}
	e.viewMu.Lock()
	defer e.viewMu.Unlock()
	if a.kind == answerRecord {
		e.answeredUpTo(a.tok)
	}
	if a.kind != answerOverride && s.sync.localIsTheStore() {
		// While the store is degraded the local view is the store, and
		// only its own transitions move it; an answer that arrives late (a
		// call sent before another one failed) waits for the resync, which
		// reads the breaker back. Before, such an answer restored Redis's
		// state silently under the local view's own chain of transitions:
		// the fleet soak saw a local half_open, then open->half_open.
		return
	}
	if a.kind != answerOverride && e.failurePending() && s.wouldReadmit(e, snap) {
		return
	}
	if inc != e.inc {
		if e.inc != "" && s.opts.OnOverlay != nil {
			// The key was made again: Redis was emptied (FLUSHALL, a
			// restart without persistence) or lost it, and the admin
			// overlays went with it. They are read now, and put back
			// (R-ST15), rather than at the next periodic read: a replica
			// that starts on the emptied Redis meanwhile runs without an
			// acknowledged change (#49: a fresh trip judged at the file's
			// threshold was lost).
			s.opts.OnOverlay("")
		}
		e.inc, e.seq = inc, 0
	}
	if seq < e.seq {
		// Older than the view. Either a late answer (two calls crossed) or
		// Redis went back: a failover promoted a replica that lacked the
		// last writes, or an old snapshot was restored. The key's
		// incarnation is the same, so nothing else tells the two apart; the
		// next refresh heals the breaker either way (healBehind), which is
		// a no-op for a late answer.
		if !e.behind.Swap(true) {
			s.wake()
		}
		return
	}
	e.seq = seq
	if h := applyHook; h != nil {
		h()
	}
	// Whether the view is the store is asked again under the breaker's
	// lock (RestoreBy): the store may have turned degraded since the
	// check above, and the view's own transitions are its chain from
	// then on.
	mode, _ := breaker.RestoreBy(s.local, e.lk(), snap, s.opts.Clock.Now().UnixNano(), a.reason, func() breaker.RestoreMode {
		switch {
		case !s.sync.localIsTheStore():
			return breaker.RestoreSilently
		case a.kind == answerOverride:
			// The view is the store: the override moves its chain, and
			// the chain says so (decided_by=local), as the view's own
			// force would.
			return breaker.RestoreAsOwn
		}
		return breaker.RestoreNone
	})
	if mode != breaker.RestoreNone && s.opts.OnView != nil {
		s.opts.OnView(e.id, snap.State)
	}
}

// applyHook, when a test sets it, runs in apply between its checks and the
// restore: where another goroutine can turn the store degraded.
var applyHook func()

func (s *Store) event(e *entry, ev event, now int64) breaker.Event {
	out := breaker.Event{
		ID: e.id, Provider: e.id.Provider(), From: breaker.State(ev.From), To: breaker.State(ev.To), Reason: ev.Reason,
		At: now, Failures: ev.Failures, Threshold: e.policy().FailureThreshold, PolicyVersion: e.policy().Version,
		OpenUntil: ev.OpenUntil * ms, OpenedAt: ev.OpenedAt * ms, Reopens: ev.Reopens, WindowCalls: ev.Calls, WindowFailures: ev.Fails,
		Generation: ev.Gen, DecidedBy: breaker.DecidedByRedis,
	}
	if ev.Forever == 1 && ev.To == int(breaker.Open) {
		out.OpenUntil = breaker.Never
	}
	switch ev.Sat {
	case 1:
		out.Saturation, out.SaturatedUntil, out.Reason, out.Threshold = breaker.SaturationStarted, ev.SatUntil*ms, "", 0
	case 2:
		out.Saturation, out.Reason, out.Threshold = breaker.SaturationEnded, "", 0
	}
	return out
}

// viewMemory names the embedded local view. Its Peek is the Store's
// (breaker.Store): the memory store's own decision path, answered from
// local state only, with no round trip (R-ST2). Every other method of the
// Store is defined here and shadows the view's.
type viewMemory = breaker.Memory

func sec(v int64) *float64 {
	if v == 0 {
		return nil
	}
	f := float64(v) / 1e3
	return &f
}

func statusOf(e *entry, r *result, now int64) breaker.Status {
	st := breaker.Status{
		State: breaker.State(r.State).String(), Failures: r.Failures, OpenedAt: sec(r.OpenedAt), ReopenedAt: sec(r.ReopenedAt),
		Reopens: r.Reopens, Reason: r.Reason, Scope: e.id.Scope, BlockedUntil: sec(r.BlockedUntil), ProbesInFlight: r.Leases,
		Forced: r.Forced == 1, PolicyVersion: e.policy().Version, WindowCalls: r.Calls, WindowFailures: r.Fails,
		WindowSlowCalls: r.Slow, ConsecutiveFailures: r.Consecutive, Generation: r.Gen,
	}
	if r.State == int(breaker.Open) && !(r.Forced == 1 && r.ForcedUntil == 0) {
		st.OpenUntil = sec(r.OpenUntil)
	}
	if share := breaker.RampShare(e.policy(), r.ClosedAt*ms, now); share > 0 && r.State == int(breaker.Closed) {
		v := float64(share) / 10
		st.RampPercent = &v
	}
	if r.SaturatedUntil*ms > now {
		st.Saturated, st.SaturatedUntil = true, sec(r.SaturatedUntil)
	}
	st.Notable = r.State != 0 || r.BlockedUntil*ms > now || st.Saturated
	return st
}
