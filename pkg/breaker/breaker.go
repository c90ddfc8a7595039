package breaker

import (
	"sync"
	"sync/atomic"
)

// hot bits: a breaker whose hot word is 0 is closed, not blocked and not
// forced, and admits without taking its lock (R-ST1: no allocation and no
// lock on the closed path).
const (
	hotNotClosed uint32 = 1 << iota
	hotBlocked
	hotForced
)

// Breaker is one circuit breaker's local state: a route of a gateway, or a
// fleet. All methods are safe for concurrent use. The policy is passed on
// every call, so a reload applies new thresholds from the next outcome
// while the state is kept (R-P9).
type Breaker struct {
	id       ID
	provider string

	hot atomic.Uint32
	gen atomic.Uint64
	// The lock-free read path (hot, gen) is kept off the cache line that
	// every Record writes (mu and the counters).
	_ [48]byte

	mu           sync.Mutex
	state        State
	reason       string
	openedAt     int64 // closed→open that began this episode (unix ns)
	reopenedAt   int64 // latest half_open→open; 0 = none
	reopens      int
	openUntil    int64
	forced       bool
	forcedUntil  int64 // 0 = no end
	blockedUntil int64 // Retry-After block; 0 = none
	consecutive  int
	tumble       tumbling
	failWin      sliding // R-W2 failures over window_sec
	rateWin      sliding // R-T2/R-T4 over rate_window_sec
	leases       []lease
	nextLease    uint64
	policy       *Policy // last policy seen, for the sweep and status
	onEvent      func(Event)
}

type lease struct {
	id      uint64
	expires int64
}

func newBreaker(id ID, p *Policy, onEvent func(Event)) *Breaker {
	b := &Breaker{id: id, provider: providerOf(id), policy: p, onEvent: onEvent}
	b.failWin = newSliding(p.WindowSec)
	b.rateWin = newSliding(p.RateWindowSec)
	b.gen.Store(1)
	return b
}

func providerOf(id ID) string {
	if id.Scope == ScopeGlobal {
		return id.Route
	}
	for i := 0; i < len(id.Route); i++ {
		if id.Route[i] == ':' {
			return id.Route[:i]
		}
	}
	return id.Route
}

// ID returns the breaker's identity.
func (b *Breaker) ID() ID { return b.id }

// Provider returns the provider label (text of the route key before ':').
func (b *Breaker) Provider() string { return b.provider }

// Generation returns the current generation (R-S6).
func (b *Breaker) Generation() uint64 { return b.gen.Load() }

// Verdict is a breaker's answer to "may a request go here now?".
type Verdict struct {
	Allowed bool
	State   State
	Forced  bool
	Blocked bool
	// ProbesFull: half-open with every probe slot taken.
	ProbesFull bool
	// RecoveryAt is when the breaker may admit again (R-D6), unix ns;
	// Never for a route forced open without a duration; 0 when allowed.
	RecoveryAt int64
}

// Admission is what a dispatched request carries until its outcome is
// recorded: the generation it was admitted in and, for a half-open probe,
// its slot.
type Admission struct {
	Gen   uint64
	Lease uint64 // 0 = holds no probe slot
}

// Peek answers from local state only (R-D2, R-ST2) and takes nothing. On the
// closed path it reads one atomic word.
func (b *Breaker) Peek(now int64, p *Policy) Verdict {
	if b.hot.Load() == 0 {
		return Verdict{Allowed: true}
	}
	var evs events
	b.mu.Lock()
	b.advance(now, p, &evs)
	v := b.verdictLocked(now, p)
	b.mu.Unlock()
	evs.emit(b.onEvent)
	return v
}

func (b *Breaker) verdictLocked(now int64, p *Policy) Verdict {
	v := Verdict{State: b.state, Forced: b.forced, Blocked: b.blockedUntil > now}
	var rec int64
	switch {
	case b.forced:
		rec = Never
		if b.forcedUntil != 0 {
			rec = b.forcedUntil
		}
	case b.state == Open:
		rec = b.openUntil
	case b.state == HalfOpen && p.HalfOpenMaxProbes > 0 && len(b.leases) >= p.HalfOpenMaxProbes:
		v.ProbesFull = true
		rec = b.earliestLease()
	}
	if v.Blocked && b.blockedUntil > rec {
		rec = b.blockedUntil
	}
	v.RecoveryAt = rec
	v.Allowed = rec == 0
	return v
}

func (b *Breaker) earliestLease() int64 {
	var e int64
	for _, l := range b.leases {
		if e == 0 || l.expires < e {
			e = l.expires
		}
	}
	return e
}

// Acquire admits one request. On a closed breaker it reads two atomic words.
// On a half-open one it takes a probe slot unless shadow is set (R-S3: only
// the chosen route takes a slot, never in shadow mode); it fails when every
// slot is taken. A request sent to an unhealthy route anyway (try_all,
// shadow) is admitted with force=true and holds no slot.
func (b *Breaker) Acquire(now int64, p *Policy, shadow, force bool) (Admission, bool) {
	gen := b.gen.Load()
	if b.hot.Load() == 0 {
		return Admission{Gen: gen}, true
	}
	var evs events
	b.mu.Lock()
	b.advance(now, p, &evs)
	adm, ok := Admission{Gen: b.gen.Load()}, true
	if b.state == HalfOpen && !b.forced && !shadow && p.HalfOpenMaxProbes > 0 && b.blockedUntil <= now {
		if len(b.leases) < p.HalfOpenMaxProbes {
			b.nextLease++
			b.leases = append(b.leases, lease{id: b.nextLease, expires: now + p.ProbeTimeoutMs*1e6})
			adm.Lease = b.nextLease
		} else if !force {
			ok = false
		}
	} else if !force && !shadow {
		ok = b.verdictLocked(now, p).Allowed
	}
	b.mu.Unlock()
	evs.emit(b.onEvent)
	return adm, ok
}

// Release frees a probe slot without recording anything (a request that
// was admitted but never dispatched).
func (b *Breaker) Release(adm Admission) {
	if adm.Lease == 0 {
		return
	}
	b.mu.Lock()
	b.releaseLocked(adm.Lease)
	b.mu.Unlock()
}

func (b *Breaker) releaseLocked(id uint64) {
	for i, l := range b.leases {
		if l.id == id {
			b.leases = append(b.leases[:i], b.leases[i+1:]...)
			return
		}
	}
}

// Recorded tells the caller what a Record did.
type Recorded struct {
	Outcome Outcome
	// Stale: the admission was from an earlier generation; the outcome was
	// counted in metrics only (R-S6).
	Stale bool
}

// Record applies one judged attempt (R-S1..R-S4, R-T*, R-W*, R-A1).
func (b *Breaker) Record(now int64, p *Policy, adm Admission, r Result) Recorded {
	o := p.Judge(r)
	var evs events
	b.mu.Lock()
	b.syncPolicy(now, p)
	if adm.Lease != 0 {
		b.releaseLocked(adm.Lease)
	}
	b.advance(now, p, &evs)
	b.retryAfterLocked(now, p, r)
	stale := adm.Gen != b.gen.Load()
	if !stale {
		b.applyLocked(now, p, o, &evs)
	}
	b.mu.Unlock()
	evs.emit(b.onEvent)
	return Recorded{Outcome: o, Stale: stale}
}

// syncPolicy adopts a new policy (R-P9): state is kept; window lengths
// follow the new policy.
func (b *Breaker) syncPolicy(now int64, p *Policy) {
	if b.policy == p {
		return
	}
	b.policy = p
	b.failWin.resize(p.WindowSec, now)
	b.rateWin.resize(p.RateWindowSec, now)
}

func (b *Breaker) retryAfterLocked(now int64, p *Policy, r Result) {
	if r.RetryAfterUnixNano == 0 || p.RetryAfter != RetryAfterBlock || (r.Status != 429 && r.Status != 503) {
		return
	}
	until := r.RetryAfterUnixNano
	if limit := now + int64(p.MaxRetryAfterSec)*1e9; until > limit {
		until = limit
	}
	if until > b.blockedUntil && until > now {
		b.blockedUntil = until // extended, never shortened
		b.setHot()
	}
}

func (b *Breaker) applyLocked(now int64, p *Policy, o Outcome, evs *events) {
	switch b.state {
	case Closed:
		if o.Class == Neither {
			return
		}
		failed := o.Class == Failure
		b.rateWin.add(now, true, failed, o.Slow)
		if !failed {
			b.consecutive = 0
			b.checkSlowRate(now, p, evs)
			return
		}
		b.consecutive++
		var count int
		if p.Window == WindowSliding {
			b.failWin.add(now, false, true, false)
			_, f, _ := b.failWin.totals(now)
			count = int(f)
		} else {
			count = b.tumble.add(now, p.WindowSec)
		}
		switch {
		case o.OpenNow:
			b.open(now, p, o.Reason, evs)
		case count >= p.FailureThreshold:
			b.open(now, p, o.Reason, evs)
		case p.ConsecutiveFailures > 0 && b.consecutive >= p.ConsecutiveFailures:
			b.open(now, p, o.Reason, evs)
		default:
			if p.FailureRatePercent > 0 {
				calls, fails, _ := b.rateWin.totals(now)
				if calls >= int64(p.MinimumRequests) && float64(fails)*100 >= p.FailureRatePercent*float64(calls) {
					b.open(now, p, ReasonFailureRate, evs)
					return
				}
			}
			b.checkSlowRate(now, p, evs)
		}
	case HalfOpen:
		switch o.Class {
		case Success:
			b.close(now, p, ReasonProbeSuccess, evs)
		case Failure:
			b.reopen(now, p, o.Reason, evs)
		}
	case Open:
		// R-S4: nothing is counted while open.
	}
}

func (b *Breaker) checkSlowRate(now int64, p *Policy, evs *events) {
	if p.SlowCallMs <= 0 || b.state != Closed {
		return
	}
	calls, _, slow := b.rateWin.totals(now)
	if calls >= int64(p.MinimumRequests) && float64(slow)*100 >= p.SlowCallRatePercent*float64(calls) {
		b.open(now, p, ReasonSlowCallRate, evs)
	}
}

// advance makes due time-driven transitions: forced-open expiry, open →
// half_open after the cooldown (R-S2), expired probe leases and blocks.
func (b *Breaker) advance(now int64, p *Policy, evs *events) {
	if b.forced {
		if b.forcedUntil != 0 && now >= b.forcedUntil {
			b.forced, b.forcedUntil = false, 0
			b.close(now, p, ReasonForceExpired, evs)
		}
	} else if b.state == Open && now >= b.openUntil {
		from := b.state
		b.state = HalfOpen
		b.leases = b.leases[:0]
		b.bump()
		evs.add(b.event(now, p, from, ReasonCooldown))
	}
	if len(b.leases) > 0 {
		kept := b.leases[:0]
		for _, l := range b.leases {
			if l.expires > now {
				kept = append(kept, l)
			}
		}
		b.leases = kept
	}
	if b.blockedUntil != 0 && now >= b.blockedUntil {
		b.blockedUntil = 0
	}
	b.setHot()
}

func (b *Breaker) bump() { b.gen.Add(1) }

func (b *Breaker) setHot() {
	var h uint32
	if b.state != Closed {
		h |= hotNotClosed
	}
	if b.blockedUntil != 0 {
		h |= hotBlocked
	}
	if b.forced {
		h |= hotForced
	}
	if b.hot.Load() != h { // a store on every Record would bounce the cache line readers use
		b.hot.Store(h)
	}
}

// cooldownFor returns the cooldown of the k-th consecutive opening of an
// episode (k = 1 for closed→open): cooldown_ms × multiplier^(k-1), capped
// at max_cooldown_ms when the multiplier is above 1.
func cooldownFor(p *Policy, k int) int64 {
	cd := float64(p.CooldownMs)
	if p.BackoffMultiplier > 1 {
		for i := 1; i < k && cd < float64(p.MaxCooldownMs); i++ {
			cd *= p.BackoffMultiplier
		}
		if cd > float64(p.MaxCooldownMs) {
			cd = float64(p.MaxCooldownMs)
		}
	}
	return int64(cd) * 1e6
}

func (b *Breaker) open(now int64, p *Policy, reason string, evs *events) {
	from := b.state
	b.state, b.reason = Open, reason
	b.openedAt, b.reopenedAt, b.reopens = now, 0, 0
	b.openUntil = now + cooldownFor(p, 1)
	b.bump()
	b.setHot()
	evs.add(b.event(now, p, from, reason))
}

func (b *Breaker) reopen(now int64, p *Policy, reason string, evs *events) {
	from := b.state
	b.state, b.reason = Open, reason
	b.reopenedAt = now
	b.reopens++
	b.openUntil = now + cooldownFor(p, b.reopens+1)
	b.leases = b.leases[:0]
	b.bump()
	b.setHot()
	evs.add(b.event(now, p, from, reason))
}

// close ends the episode: counts, backoff and episode times are cleared
// (R-S1), and the rate window starts afresh (resilience4j resets metrics on
// half_open → closed).
func (b *Breaker) close(now int64, p *Policy, reason string, evs *events) {
	from := b.state
	b.state, b.reason = Closed, ""
	b.openedAt, b.reopenedAt, b.reopens, b.openUntil = 0, 0, 0, 0
	b.consecutive = 0
	b.tumble = tumbling{}
	b.failWin.reset()
	b.rateWin.reset()
	b.leases = b.leases[:0]
	if from != Closed {
		b.bump()
		evs.add(b.event(now, p, from, reason))
	}
	b.setHot()
}
