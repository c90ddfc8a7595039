package breaker

import "time"

// Store holds breakers. It is shaped so that a shared (Redis) store can
// replace the memory one without changing callers:
//   - a decision reads a breaker's local state only (Breaker.Peek), plus,
//     for a half-open route, taking a probe slot (Acquire: one bounded call
//     to the shared store);
//   - recording an outcome is one call (Record), which a shared store turns
//     into one atomic script, off the request's critical path;
//   - overrides and the sweep go through the store so that they reach every
//     replica.
type Store interface {
	// Breaker returns the local handle of a breaker, creating it on first
	// use. Handles stay valid across config reloads (R-P9).
	Breaker(id ID, p *Policy) *Breaker
	// Lookup returns an existing breaker.
	Lookup(id ID) (*Breaker, bool)
	Acquire(b *Breaker, now int64, p *Policy, shadow, force bool) (Admission, bool)
	Record(b *Breaker, now int64, p *Policy, adm Admission, r Result) Recorded
	ForceOpen(b *Breaker, now int64, p *Policy, d time.Duration) error
	ForceClose(b *Breaker, now int64, p *Policy) error
	Reset(b *Breaker, now int64, p *Policy) error
	// Sweep makes due transitions on every breaker (R-S2).
	Sweep(now int64)
	// Each calls fn for every breaker.
	Each(fn func(*Breaker))
}
