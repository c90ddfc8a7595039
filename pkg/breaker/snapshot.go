package breaker

// Snapshot is the decision state of one breaker: what a decision reads,
// without its windows. A shared store keeps each replica's local view as a
// Memory store and puts the shared state into it with Restore (R-ST2); it
// reads a local state back with Snapshot to write it to the shared store
// after an outage (R-ST4). Times are unix nanoseconds.
type Snapshot struct {
	State        State
	Generation   uint64
	Reason       string
	OpenedAt     int64
	ReopenedAt   int64
	Reopens      int
	OpenUntil    int64
	Forced       bool
	ForcedUntil  int64 // 0 = no end
	BlockedUntil int64 // 0 = none
	// SaturatedUntil: the route's quota headroom is below its floors until
	// then (R-H2, R-H3); 0 = none.
	SaturatedUntil int64
	// SaturatedSince: when that saturation began (R-H7).
	SaturatedSince int64
	// Probes is how many half-open probe slots the shared store has given
	// out, the earliest of them ending at ProbesUntil: a full set makes the
	// local view answer "probes full" without asking.
	Probes      int
	ProbesUntil int64
	// ClosedAt is the half_open→closed a recovery ramp runs from (R-D8);
	// 0 = none.
	ClosedAt int64
}

// Restore makes the breaker's decision state s, as another replica (through
// the shared store) made it. It emits no event: the replica whose store
// call made the transition reports it. Leases end when the state changes
// (the shared store holds the probe slots); windows restart when the
// breaker closes.
//
// It is a function, not a method, so that a store embedding a Memory as its
// view does not offer it to callers.
func Restore(s *Memory, k Key, snap Snapshot) error {
	m, err := s.get(k)
	if err != nil {
		return err
	}
	m.restore(snap)
	return nil
}

// SnapshotOf returns the breaker's decision state (due transitions made
// first, as every read does).
func SnapshotOf(s *Memory, k Key, now int64) (Snapshot, error) {
	m, err := s.get(k)
	if err != nil {
		return Snapshot{}, err
	}
	var evs events
	m.mu.Lock()
	m.advance(now, &evs)
	snap := Snapshot{
		State: m.state, Generation: m.gen, Reason: m.reason, OpenedAt: m.openedAt, ReopenedAt: m.reopenedAt,
		Reopens: m.reopens, OpenUntil: m.openUntil, Forced: m.forced, ForcedUntil: m.forcedUntil, BlockedUntil: m.blockedUntil,
		SaturatedUntil: m.saturatedUntil, SaturatedSince: m.saturatedSince, ClosedAt: m.closedAt,
	}
	m.unlock(&evs)
	return snap, nil
}

func (m *machine) restore(s Snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restoreLocked(s)
}

func (m *machine) restoreLocked(s Snapshot) {
	if s.State != m.state {
		if s.State == Closed {
			m.consecutive = 0
			m.tumble = tumbling{}
			m.failWin.reset()
			m.rateWin.reset()
		}
	}
	m.state, m.gen, m.reason = s.State, s.Generation, s.Reason
	m.openedAt, m.reopenedAt, m.reopens, m.openUntil = s.OpenedAt, s.ReopenedAt, s.Reopens, s.OpenUntil
	m.forced, m.forcedUntil, m.blockedUntil = s.Forced, s.ForcedUntil, s.BlockedUntil
	m.saturatedUntil, m.saturatedSince = s.SaturatedUntil, s.SaturatedSince
	m.closedAt = s.ClosedAt
	// The shared store holds the slots; the view keeps placeholders (lease
	// id 0, never released by id) that expire with the earliest of them.
	m.leases = m.leases[:0]
	for i := 0; i < s.Probes && s.State == HalfOpen; i++ {
		m.leases = append(m.leases, lease{expires: s.ProbesUntil})
	}
	if m.gen == 0 {
		m.gen = 1
	}
	m.publish()
}

// RestoreMode is how RestoreBy takes a state: not at all, silently (as
// Restore), or as the view's own transition (one event).
type RestoreMode int

const (
	// RestoreNone leaves the view as it is.
	RestoreNone RestoreMode = iota
	// RestoreSilently is Restore: another replica's transition, reported
	// by that replica.
	RestoreSilently
	// RestoreAsOwn reports the change as the view's own transition: an
	// operator's override that Redis answered while the view was the store
	// (a shared store's degraded mode, R-ST4). The view's chain of
	// transitions is then the store's, and one that jumped with no line (a
	// silent open, then "open->closed" when the force ran out) explained
	// nothing (#54, the fleet soak under load).
	RestoreAsOwn
)

// RestoreBy restores snap as how says, asked under the breaker's lock: no
// transition of the view's own comes between the choice and the restore.
// A shared store chooses by whether its view is the store at that moment;
// before, it chose first and restored after, and a store that turned
// degraded in between (its view's own transition logged meanwhile) had
// Redis's state put silently under that transition (#54). reason names an
// override taken as the view's own. It reports the mode taken.
func RestoreBy(s *Memory, k Key, snap Snapshot, now int64, reason string, how func() RestoreMode) (RestoreMode, error) {
	m, err := s.get(k)
	if err != nil {
		return RestoreNone, err
	}
	var evs events
	m.mu.Lock()
	mode := how()
	if mode != RestoreNone {
		from := m.state
		m.restoreLocked(snap)
		if mode == RestoreAsOwn && from != m.state {
			evs.add(m.event(now, m.policy, from, reason))
		}
	}
	m.unlock(&evs)
	return mode, nil
}

// AcquireHealthy admits a request on the lock-free path when the local
// state is healthy (closed, not blocked, not forced) or the policy is off:
// one atomic load. It reports false when the breaker needs more (a probe
// slot, a refusal) or is not installed; a shared store then asks its
// backend.
func AcquireHealthy(s *Memory, k Key) (Admission, bool) {
	m, err := s.get(k)
	if err != nil {
		return Admission{}, false
	}
	if w := m.word.Load(); w&hotUnhealthy == 0 || w&hotOff != 0 {
		return Admission{Gen: w >> genShift}, true
	}
	return Admission{}, false
}

// AcquireForced admits a request sent to an unhealthy route anyway (by
// try_all or the capacity floor) on the local state alone, when no probe
// slot is at stake: the route is open, forced open, blocked by a
// Retry-After, or half-open with every slot taken. It reports false when
// the route is half-open with a slot free (the forced request would take
// it as a probe, and a shared store must take that slot where the bound
// holds for every replica) or when the breaker is not installed. A forced
// admission of an unhealthy route takes no slot in any store, so this
// answer is the one the backend would give; its generation is the local
// state's, after its due transitions.
func AcquireForced(s *Memory, k Key, now int64) (Admission, bool) {
	m, err := s.get(k)
	if err != nil {
		return Admission{}, false
	}
	var evs events
	m.mu.Lock()
	m.advance(now, &evs)
	p := m.policy
	adm := Admission{Gen: m.gen}
	slot := p.Active() && p.Mode != ModeShadow && m.state == HalfOpen && !m.forced && p.HalfOpenMaxProbes > 0 &&
		m.blockedUntil <= now && len(m.leases) < p.HalfOpenMaxProbes
	m.unlock(&evs)
	return adm, !slot
}

// CurrentGen is k's generation now on s (0 when not installed): what an
// outcome recorded on a view that did not admit its request carries.
func CurrentGen(s *Memory, k Key) uint64 {
	m, err := s.get(k)
	if err != nil {
		return 0
	}
	return m.word.Load() >> genShift
}
