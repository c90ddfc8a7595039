package breaker

import "time"

// forceOpen pins the breaker open (R-S5): it is skipped before the floor and
// before try_all, never probed, and when d (if > 0) has passed it is closed
// with cleared state.
func (m *machine) forceOpen(now int64, d time.Duration) {
	var evs events
	m.mu.Lock()
	from := m.state
	m.forced = true
	m.forcedUntil = 0
	if d > 0 {
		m.forcedUntil = now + int64(d)
	}
	m.state, m.reason = Open, ReasonForced
	if from == Closed {
		m.openedAt, m.reopenedAt, m.reopens = now, 0, 0
	}
	m.openUntil = m.forcedUntil
	m.leases = m.leases[:0]
	m.bump()
	m.publish()
	if from != Open {
		evs.add(m.event(now, m.policy, from, ReasonForced))
	}
	m.unlock(&evs)
}

// forceClose closes the breaker once, clearing its counts; it does not pin
// it closed, and it keeps a Retry-After block.
func (m *machine) forceClose(now int64) { m.overrideClose(now, ReasonForceClose, false) }

// reset clears state, force flags and Retry-After blocks.
func (m *machine) reset(now int64) { m.overrideClose(now, ReasonReset, true) }

func (m *machine) overrideClose(now int64, reason string, clearBlock bool) {
	var evs events
	m.mu.Lock()
	m.forced, m.forcedUntil = false, 0
	if clearBlock {
		// A reset clears what the provider announced too: a Retry-After
		// block and a saturation (an announced quota of 0 would pin the
		// route for up to max_retry_after_sec with no override).
		m.blockedUntil = 0
		if m.saturatedUntil > now {
			m.saturatedUntil = 0
			evs.add(m.saturationEvent(now, SaturationEnded))
		}
		m.saturatedUntil = 0
	}
	from := m.state
	m.close(now, m.policy, reason, &evs)
	if from == Closed {
		m.bump() // in-flight outcomes from before the override change nothing
		m.publish()
	}
	m.unlock(&evs)
}

// tick makes due time-driven transitions (the sweep, R-S2).
func (m *machine) tick(now int64) {
	if m.word.Load()&hotUnhealthy == 0 {
		return
	}
	var evs events
	m.mu.Lock()
	m.advance(now, &evs)
	m.unlock(&evs)
}
