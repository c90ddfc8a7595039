package breaker

import "time"

// Event is one state transition, carrying everything the `[circuit_breaker]`
// log line and the transition metrics need (SPEC §9).
type Event struct {
	ID             ID
	Provider       string
	From, To       State
	Reason         string
	At             int64 // unix ns
	Failures       int   // failures counted in the window when it happened
	Threshold      int
	PolicyVersion  string
	OpenUntil      int64 // unix ns; 0 unless To is open
	OpenedAt       int64
	Reopens        int
	WindowCalls    int64
	WindowFailures int64
	Generation     uint64
	// RampUntil is when the recovery ramp a half_open→closed began ends
	// (R-D8), unix ns; 0 = no ramp.
	RampUntil int64
	// DecidedBy says which state made the transition: "" (the memory
	// store), DecidedByRedis (the shared state, by a script) or
	// DecidedByLocal (a Redis store's local view while Redis was
	// unreachable). An operator reading a fleet's logs needs it: local
	// transitions are one replica's own, the shared ones everyone's.
	DecidedBy string
	// Saturation is SaturationStarted or SaturationEnded for an event that
	// is no transition (From == To): the route's quota headroom crossed its
	// floor, or the saturation ended (R-H4); "" for a transition.
	// SaturatedUntil is when a started one ends, unix ns.
	Saturation     string
	SaturatedUntil int64
	// ReplicaScoped: a transition of one replica's own view of its egress
	// (R-FD3), that replica's id in Replica; false for the route's state.
	ReplicaScoped bool
	Replica       string
}

// The Saturation values of an event.
const (
	SaturationStarted = "saturated"
	SaturationEnded   = "unsaturated"
)

// The DecidedBy values of a remote store's transitions.
const (
	DecidedByRedis = "redis"
	DecidedByLocal = "local"
)

// Transition is the transition label, e.g. "closed->open".
func (e Event) Transition() string { return e.From.String() + "->" + e.To.String() }

// OpenUntilTime returns OpenUntil as a time (zero when none).
func (e Event) OpenUntilTime() time.Time {
	if e.OpenUntil == 0 || e.OpenUntil == Never {
		return time.Time{}
	}
	return time.Unix(0, e.OpenUntil)
}

// events collects the transitions made under a breaker's lock so that the
// listener runs after the lock is released (listeners outside the lock, as
// failsafe-go does). Empty, it is one word: every Record declares one, and
// a fixed array of Events (it was four, 800 bytes) was zeroed on every
// call; a transition, which is rare, allocates instead.
type events struct{ a []Event }

func (e *events) add(ev Event) {
	if len(e.a) < 4 {
		e.a = append(e.a, ev)
	}
}

func (e *events) emit(fn func(Event)) {
	if fn == nil {
		return
	}
	for _, ev := range e.a {
		fn(ev)
	}
}

// event builds the Event of a transition just made (b.state is the new
// state). Called with mu held.
func (m *machine) event(now int64, p *Policy, from State, reason string) Event {
	calls, fails, _ := m.rateWin.totals(now)
	ev := Event{
		ID: m.id, Provider: m.provider, From: from, To: m.state, Reason: reason, At: now,
		Failures: m.failuresLocked(now, p), Threshold: p.FailureThreshold, PolicyVersion: p.Version,
		OpenedAt: m.openedAt, Reopens: m.reopens, WindowCalls: calls, WindowFailures: fails,
		Generation: m.gen,
	}
	if m.state == Open {
		ev.OpenUntil = m.openUntil
		if m.forced && m.forcedUntil == 0 {
			ev.OpenUntil = Never
		}
	}
	if m.closedAt != 0 && p.RecoveryRampSec > 0 {
		ev.RampUntil = m.closedAt + int64(p.RecoveryRampSec)*1e9
	}
	return ev
}

// failuresLocked is the failure count shown for the breaker: the tumbling
// counter (0 once expired) or the sliding window's failures.
func (m *machine) failuresLocked(now int64, p *Policy) int {
	if p.Window == WindowSliding && m.failWin.buckets != nil {
		_, f, _ := m.failWin.totals(now)
		return int(f)
	}
	return m.tumble.current(now)
}

// JournalScope is the scope an operator reads for the transition: the
// breaker's, or ScopeReplica for one replica's own open (R-FD3).
func (e Event) JournalScope() Scope {
	if e.ReplicaScoped {
		return ScopeReplica
	}
	return e.ID.Scope
}
