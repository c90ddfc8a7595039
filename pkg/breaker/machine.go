package breaker

import (
	"sync"
	"sync/atomic"
)

// Bits of a machine's published word. The word packs the generation (high
// bits) with these flags, so that the lock-free paths read both from one
// atomic load: an admission can never pair a generation with the flags of
// another (R-S6).
const (
	hotNotClosed uint64 = 1 << iota
	hotBlocked
	hotForced
	hotOff     // the installed policy is off or disabled (R-M1, R-M4)
	hotShadow  // the installed policy is shadow (R-M4)
	hotRamping // closed, on its recovery ramp (R-D8): the decision needs its share

	hotUnhealthy = hotNotClosed | hotBlocked | hotForced
	genShift     = 8
)

// machine is one circuit breaker's state (a route of a gateway, or a
// fleet): the state machine of SPEC §5. It lives inside a Store; nothing
// outside a store touches it. All methods are safe for concurrent use.
type machine struct {
	id       ID
	provider string
	key      Key // the key its store hands out

	// word is gen<<genShift | hot bits, written under mu, read lock-free.
	word atomic.Uint64
	// The lock-free read path is kept off the cache line every Record
	// writes (mu and the counters).
	_ [56]byte

	mu           sync.Mutex
	policy       *Policy // installed by the store (R-P9): every outcome is judged with it
	gen          uint64
	state        State
	reason       string
	openedAt     int64 // closed→open that began this episode (unix ns)
	reopenedAt   int64 // latest half_open→open; 0 = none
	reopens      int
	openUntil    int64
	forced       bool
	forcedUntil  int64 // 0 = no end
	blockedUntil int64 // Retry-After block; 0 = none
	// saturatedUntil: the route's provider announced less quota than its
	// headroom floors (R-H2); skipped like a block until then; 0 = none.
	saturatedUntil int64
	// saturatedSince: when the present saturation began (R-H7).
	saturatedSince int64
	consecutive    int
	slowBy         string // the signal of the latest slow call (R-T4..R-T6)
	tumble         tumbling
	failWin        sliding // R-W2 failures over window_sec (sliding policies only)
	rateWin        sliding // R-T2/R-T4 over rate_window_sec
	leases         []lease
	nextLease      uint64
	// closedAt is the half_open→closed that began the recovery ramp
	// (R-D8), unix ns; 0 = not ramping. On a shared store it is the close
	// the store holds, so every replica ramps from the same time.
	closedAt int64
	// keys are the record keys applied lately (R-DL11).
	keys recordKeys

	// emitMu orders transition events: it is taken before mu is released
	// by whoever made a transition, so listeners see a breaker's events in
	// the order they happened, still outside mu.
	emitMu  sync.Mutex
	onEvent func(Event)
}

type lease struct {
	id      uint64
	expires int64
}

func newMachine(id ID, p *Policy, now int64, onEvent func(Event)) *machine {
	m := &machine{id: id, provider: providerOf(id), onEvent: onEvent, gen: 1}
	m.policy = p
	m.rateWin = newSliding(p.RateWindowSec)
	if p.Window == WindowSliding {
		m.failWin = newSliding(p.WindowSec)
	}
	m.publish()
	return m
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

// install adopts a new policy (R-P9): state is kept, window lengths follow
// the new policy, and the next outcome is judged with it.
func (m *machine) install(p *Policy, now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.policy == p {
		return
	}
	m.policy = p
	m.rateWin.resize(p.RateWindowSec, now)
	if p.Window == WindowSliding {
		if m.failWin.buckets == nil {
			m.failWin = newSliding(p.WindowSec)
		} else {
			m.failWin.resize(p.WindowSec, now)
		}
	} else {
		m.failWin = sliding{}
	}
	m.publish()
}

// publish stores the word readers use. Called with mu held after any change
// to the state, flags, generation or policy mode.
func (m *machine) publish() {
	h := m.gen << genShift
	if m.state != Closed {
		h |= hotNotClosed
	}
	if m.blockedUntil != 0 || m.saturatedUntil != 0 {
		h |= hotBlocked
	}
	if m.forced {
		h |= hotForced
	}
	if !m.policy.Active() {
		h |= hotOff
	} else if m.policy.Mode == ModeShadow {
		h |= hotShadow
	}
	if m.closedAt != 0 && m.state == Closed && m.policy.RecoveryRampSec > 0 {
		h |= hotRamping
	}
	if m.word.Load() != h { // a store on every Record would bounce the readers' cache line
		m.word.Store(h)
	}
}

func (m *machine) bump() { m.gen++ }

// unlock releases mu and hands the events collected under it to the
// listener, in order (see emitMu).
func (m *machine) unlock(evs *events) {
	if len(evs.a) == 0 || m.onEvent == nil {
		m.mu.Unlock()
		return
	}
	m.emitMu.Lock()
	m.mu.Unlock()
	evs.emit(m.onEvent)
	m.emitMu.Unlock()
}

var (
	verdictHealthy       = Verdict{Allowed: true}
	verdictHealthyShadow = Verdict{Allowed: true, Shadow: true}
	verdictOff           = Verdict{Allowed: true, Off: true}
)

// peek answers from local state only and takes nothing. On the closed path
// it reads one atomic word.
func (m *machine) peek(now int64) Verdict {
	w := m.word.Load()
	if w&(hotUnhealthy|hotOff|hotRamping) == 0 {
		// Copies of prebuilt values: building a Verdict field by field
		// here costs a store-forwarding stall that doubles the decision.
		if w&hotShadow != 0 {
			return verdictHealthyShadow
		}
		return verdictHealthy
	}
	if w&hotOff != 0 {
		return verdictOff
	}
	var evs events
	m.mu.Lock()
	m.advance(now, &evs)
	v := m.verdictLocked(now)
	m.unlock(&evs)
	return v
}

func (m *machine) verdictLocked(now int64) Verdict {
	p := m.policy
	v := Verdict{State: m.state, Forced: m.forced, Blocked: m.blockedUntil > now, Shadow: p.Mode == ModeShadow, Off: !p.Active()}
	if m.saturatedUntil > now {
		// Saturation is not health: the route stays Allowed, and route
		// selection passes it over while another can take the request
		// (Select), so it never counts toward the floor or empties a model.
		v.Saturated, v.SaturatedUntil = true, m.saturatedUntil
	}
	if v.Off {
		v.Allowed = true
		return v
	}
	var rec int64
	switch {
	case m.forced:
		rec = Never
		if m.forcedUntil != 0 {
			rec = m.forcedUntil
		}
	case m.state == Open:
		rec = m.openUntil
	case m.state == HalfOpen && p.HalfOpenMaxProbes > 0 && len(m.leases) >= p.HalfOpenMaxProbes:
		v.ProbesFull = true
		rec = m.earliestLease()
	}
	if v.Blocked && m.blockedUntil > rec {
		rec = m.blockedUntil
	}
	v.RecoveryAt = rec
	v.Allowed = rec == 0
	v.RampPermille = m.rampLocked(now)
	return v
}

// rampLocked is the closed route's share of its traffic on the recovery
// ramp (R-D8), in per mille: start + (1000 − start) × elapsed / ramp; 0
// when not ramping. A ramp that ended is forgotten (the fast path again).
func (m *machine) rampLocked(now int64) uint16 {
	if m.closedAt == 0 || m.state != Closed {
		return 0
	}
	r := RampShare(m.policy, m.closedAt, now)
	if r == 0 {
		m.closedAt = 0 // over: the fast path again
		m.publish()
	}
	return r
}

// RampShare is a closed route's share of its traffic (per mille) at now on
// a recovery ramp begun at closedAt (R-D8); 0 when there is none or it is
// over.
func RampShare(p *Policy, closedAt, now int64) uint16 {
	if closedAt == 0 || p.RecoveryRampSec <= 0 {
		return 0
	}
	ramp := int64(p.RecoveryRampSec) * 1e9
	elapsed := now - closedAt
	if elapsed >= ramp {
		return 0
	}
	if elapsed < 0 {
		elapsed = 0
	}
	start := int64(p.RecoveryRampStartPercent * 10)
	return uint16(start + (1000-start)*elapsed/ramp)
}

func (m *machine) earliestLease() int64 {
	var e int64
	for _, l := range m.leases {
		if e == 0 || l.expires < e {
			e = l.expires
		}
	}
	return e
}

// acquire admits one request. On a healthy breaker it reads one atomic
// word. On a half-open prod breaker it takes a probe slot, and fails when
// every slot is taken unless force is set (a request sent to an unhealthy
// route anyway, by try_all or the floor, is admitted without a slot). A
// shadow breaker never takes a slot and never refuses (R-M4).
func (m *machine) acquire(now int64, force bool) (Admission, bool) {
	w := m.word.Load()
	if w&hotUnhealthy == 0 || w&hotOff != 0 {
		return Admission{Gen: w >> genShift}, true
	}
	var evs events
	m.mu.Lock()
	m.advance(now, &evs)
	p := m.policy
	adm, ok := Admission{Gen: m.gen}, true
	switch {
	case !p.Active() || p.Mode == ModeShadow:
	case m.state == HalfOpen && !m.forced && p.HalfOpenMaxProbes > 0 && m.blockedUntil <= now:
		if len(m.leases) < p.HalfOpenMaxProbes {
			m.nextLease++
			m.leases = append(m.leases, lease{id: m.nextLease, expires: now + p.ProbeTimeoutMs*1e6})
			adm.Lease = m.nextLease
		} else if !force {
			ok = false
		}
	case !force:
		ok = m.verdictLocked(now).Allowed
	}
	m.unlock(&evs)
	return adm, ok
}

// release frees a probe slot without recording anything.
func (m *machine) release(adm Admission) {
	if adm.Lease == 0 {
		return
	}
	m.mu.Lock()
	m.releaseLocked(adm.Lease)
	m.mu.Unlock()
}

func (m *machine) releaseLocked(id uint64) {
	for i, l := range m.leases {
		if l.id == id {
			m.leases = append(m.leases[:i], m.leases[i+1:]...)
			return
		}
	}
}

// record applies one attempt, judged with the installed policy (R-P9,
// R-S1..R-S4, R-T*, R-W*, R-A1), into rec (in place: see judge).
func (m *machine) record(now int64, adm Admission, r *Result, rec *Recorded) {
	var evs events
	m.mu.Lock()
	p := m.policy
	if !p.Active() {
		// R-M1/R-M4: an off breaker records nothing; a slot taken before
		// it was turned off is still given back.
		if adm.Lease != 0 {
			m.releaseLocked(adm.Lease)
		}
		m.mu.Unlock()
		*rec = Recorded{}
		return
	}
	o := &rec.Outcome
	p.judge(r, o)
	if adm.Lease != 0 {
		m.releaseLocked(adm.Lease)
	}
	if r.Key != "" && m.keys.seen(r.Key, r.KeyLifeMs, now) {
		// A repeat (R-DL11): the slot it held is free (above, an
		// idempotent release), and nothing else changes.
		m.mu.Unlock()
		*rec = Recorded{Outcome: *o, AlreadyApplied: true}
		return
	}
	m.advance(now, &evs)
	if m.id.Scope == ScopeGateway {
		// R-A1: a block applies to the route that answered, never to its
		// fleet.
		m.retryAfterLocked(now, p, r)
		m.saturateLocked(now, p, r, &evs)
	}
	// R-S6: an earlier generation's outcome changes nothing. A later one
	// (a Redis store's local view behind Redis's state) is a closed
	// route's outcome while closed, as breaker.lua counts it.
	stale := adm.Gen < m.gen || adm.Gen > m.gen && m.state != Closed
	if !stale {
		m.applyLocked(now, p, o, &evs)
	}
	m.publish()
	m.unlock(&evs)
	rec.Stale, rec.Applied = stale, true
}

func (m *machine) retryAfterLocked(now int64, p *Policy, r *Result) {
	if r.RetryAfterUnixNano == 0 || p.RetryAfter != RetryAfterBlock || (r.Status != 429 && r.Status != 503) {
		return
	}
	until := r.RetryAfterUnixNano
	if limit := now + int64(p.MaxRetryAfterSec)*1e9; until > limit {
		until = limit
	}
	if until > m.blockedUntil && until > now {
		m.blockedUntil = until // extended, never shortened
	}
}

// saturateLocked applies what the response announced of the route's quota
// (R-H2): saturated until the announced reset, capped by
// max_retry_after_sec and extended, never shortened, by a later one; ended
// early by a response that announced enough. No failure is counted. Its
// start and its end are events (R-H4: a log line each).
func (m *machine) saturateLocked(now int64, p *Policy, r *Result, evs *events) {
	switch {
	case r.SaturateUntil > now:
		until := min(r.SaturateUntil, now+int64(p.MaxRetryAfterSec)*1e9)
		if until <= m.saturatedUntil {
			return
		}
		started := m.saturatedUntil <= now
		m.saturatedUntil = until
		if started {
			m.saturatedSince = now
			evs.add(m.saturationEvent(now, SaturationStarted))
		}
	case r.Unsaturate && m.saturatedUntil > now && r.DecidedAt > m.saturatedSince:
		// Only news from after the quota ran down ends it early (R-H7).
		m.saturatedUntil = 0
		evs.add(m.saturationEvent(now, SaturationEnded))
	}
}

// saturationEvent is the event of a saturation that starts or ends.
func (m *machine) saturationEvent(now int64, what string) Event {
	return Event{ID: m.id, Provider: m.provider, From: m.state, To: m.state, At: now, Saturation: what,
		SaturatedUntil: m.saturatedUntil, PolicyVersion: m.policy.Version, Generation: m.gen}
}

func (m *machine) applyLocked(now int64, p *Policy, o *Outcome, evs *events) {
	switch m.state {
	case Closed:
		if o.Class == Neither {
			return
		}
		failed := o.Class == Failure
		if o.Counted {
			// Already counted (call and slow) when it stalled.
			m.rateWin.add(now, false, failed, false)
		} else {
			m.rateWin.add(now, true, failed, o.Slow)
		}
		if o.Slow {
			m.slowBy = o.SlowBy
		}
		if !failed {
			m.consecutive = 0
			m.checkRates(now, p, evs) // R-T2, R-T4: after every outcome
			return
		}
		m.consecutive++
		var count int
		if p.Window == WindowSliding {
			m.failWin.add(now, false, true, false)
			_, f, _ := m.failWin.totals(now)
			count = int(f)
		} else {
			count = m.tumble.add(now, p.WindowSec)
		}
		switch {
		case o.OpenNow:
			m.open(now, p, o.Reason, evs)
		case count >= p.FailureThreshold:
			m.open(now, p, o.Reason, evs)
		case p.ConsecutiveFailures > 0 && m.consecutive >= p.ConsecutiveFailures:
			m.open(now, p, o.Reason, evs)
		default:
			m.checkRates(now, p, evs)
		}
	case HalfOpen:
		switch o.Class {
		case Success:
			m.close(now, p, ReasonProbeSuccess, evs)
		case Failure:
			m.reopen(now, p, o.Reason, evs)
		}
	case Open:
		// R-S4: nothing is counted while open.
	}
}

// checkRates evaluates the failure-rate (R-T2) and slow-call-rate (R-T4)
// triggers over the rate window.
func (m *machine) checkRates(now int64, p *Policy, evs *events) {
	if m.state != Closed || (p.FailureRatePercent <= 0 && !p.TracksSlow()) {
		return
	}
	calls, fails, slow := m.rateWin.totals(now)
	if calls < int64(p.MinimumRequests) {
		return
	}
	switch {
	case p.FailureRatePercent > 0 && float64(fails)*100 >= p.FailureRatePercent*float64(calls):
		m.open(now, p, ReasonFailureRate, evs)
	case p.TracksSlow() && slow > 0 && float64(slow)*100 >= p.SlowCallRatePercent*float64(calls):
		m.open(now, p, slowReason(m.slowBy), evs)
	}
}

func slowReason(by string) string {
	switch by {
	case "stall":
		return ReasonSlowCallRateStall
	case "baseline":
		return ReasonSlowCallRateBaseline
	}
	return ReasonSlowCallRate
}

// stalled counts an attempt that is still running as a slow call the
// moment its stream stalls (R-T5), and evaluates the slow-call rate.
func (m *machine) stalled(now int64) {
	var evs events
	m.mu.Lock()
	p := m.policy
	if p.Active() && m.state == Closed && p.StallMs > 0 {
		m.rateWin.add(now, true, false, true)
		m.slowBy = "stall"
		m.checkRates(now, p, &evs)
		m.publish()
	}
	m.unlock(&evs)
}

// advance makes due time-driven transitions: forced-open expiry, open →
// half_open after the cooldown (R-S2), expired probe leases and blocks.
func (m *machine) advance(now int64, evs *events) {
	p := m.policy
	if m.forced {
		if m.forcedUntil != 0 && now >= m.forcedUntil {
			m.forced, m.forcedUntil = false, 0
			m.close(now, p, ReasonForceExpired, evs)
		}
	} else if m.state == Open && now >= m.openUntil {
		from := m.state
		m.state = HalfOpen
		m.leases = m.leases[:0]
		m.bump()
		evs.add(m.event(now, p, from, ReasonCooldown))
	}
	if len(m.leases) > 0 {
		kept := m.leases[:0]
		for _, l := range m.leases {
			if l.expires > now {
				kept = append(kept, l)
			}
		}
		m.leases = kept
	}
	if m.blockedUntil != 0 && now >= m.blockedUntil {
		m.blockedUntil = 0
	}
	if m.saturatedUntil != 0 && now >= m.saturatedUntil {
		m.saturatedUntil = 0
		evs.add(m.saturationEvent(now, SaturationEnded))
	}
	m.publish()
}

// cooldownFor returns the cooldown of the k-th consecutive opening of an
// episode (k = 1 for closed→open): cooldown_ms × multiplier^(k-1), capped
// at max_cooldown_ms when the multiplier is above 1. R-P1 bounds keep the
// result far from overflowing an int64 of nanoseconds.
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

func (m *machine) open(now int64, p *Policy, reason string, evs *events) {
	from := m.state
	m.state, m.reason = Open, reason
	m.closedAt = 0 // an open ends the ramp
	m.openedAt, m.reopenedAt, m.reopens = now, 0, 0
	m.openUntil = now + cooldownFor(p, 1)
	m.bump()
	m.publish()
	evs.add(m.event(now, p, from, reason))
}

func (m *machine) reopen(now int64, p *Policy, reason string, evs *events) {
	from := m.state
	m.state, m.reason = Open, reason
	m.reopenedAt = now
	m.reopens++
	m.openUntil = now + cooldownFor(p, m.reopens+1)
	m.leases = m.leases[:0]
	m.bump()
	m.publish()
	evs.add(m.event(now, p, from, reason))
}

// close ends the episode: counts, backoff and episode times are cleared
// (R-S1), and the rate window starts afresh (resilience4j resets metrics on
// half_open → closed).
func (m *machine) close(now int64, p *Policy, reason string, evs *events) {
	from := m.state
	m.state, m.reason = Closed, ""
	m.openedAt, m.reopenedAt, m.reopens, m.openUntil = 0, 0, 0, 0
	m.consecutive = 0
	m.tumble = tumbling{}
	m.failWin.reset()
	m.rateWin.reset()
	m.leases = m.leases[:0]
	m.closedAt = 0
	if from == HalfOpen && reason == ReasonProbeSuccess && p.RecoveryRampSec > 0 {
		m.closedAt = now // the recovery ramp begins (R-D8)
	}
	if from != Closed {
		m.bump()
		evs.add(m.event(now, p, from, reason))
	}
	m.publish()
}
