package breaker

import "time"

// ForceOpen pins the breaker open (R-S5): it is skipped before the floor and
// before try_all, never probed, and when d (if > 0) has passed it is closed
// with cleared state.
func (b *Breaker) ForceOpen(now int64, p *Policy, d time.Duration) {
	var evs events
	b.mu.Lock()
	b.syncPolicy(now, p)
	from := b.state
	b.forced = true
	b.forcedUntil = 0
	if d > 0 {
		b.forcedUntil = now + int64(d)
	}
	b.state, b.reason = Open, ReasonForced
	if from == Closed {
		b.openedAt, b.reopenedAt, b.reopens = now, 0, 0
	}
	b.openUntil = b.forcedUntil
	b.leases = b.leases[:0]
	b.bump()
	b.setHot()
	if from != Open {
		evs.add(b.event(now, p, from, ReasonForced))
	}
	b.mu.Unlock()
	evs.emit(b.onEvent)
}

// ForceClose closes the breaker once, clearing its counts; it does not pin
// it closed, and it keeps a Retry-After block.
func (b *Breaker) ForceClose(now int64, p *Policy) { b.overrideClose(now, p, ReasonForceClose, false) }

// Reset clears state, force flags and Retry-After blocks.
func (b *Breaker) Reset(now int64, p *Policy) { b.overrideClose(now, p, ReasonReset, true) }

func (b *Breaker) overrideClose(now int64, p *Policy, reason string, clearBlock bool) {
	var evs events
	b.mu.Lock()
	b.syncPolicy(now, p)
	b.forced, b.forcedUntil = false, 0
	if clearBlock {
		b.blockedUntil = 0
	}
	from := b.state
	b.close(now, p, reason, &evs)
	if from == Closed {
		b.bump() // in-flight outcomes from before the override change nothing
	}
	b.mu.Unlock()
	evs.emit(b.onEvent)
}

// Tick makes due time-driven transitions (the sweep, R-S2).
func (b *Breaker) Tick(now int64) {
	if b.hot.Load() == 0 {
		return
	}
	var evs events
	b.mu.Lock()
	b.advance(now, b.policy, &evs)
	b.mu.Unlock()
	evs.emit(b.onEvent)
}
