package breaker

import "math"

// Status is a breaker's state as the admin API shows it (R-API1, R-API3).
// Times are unix seconds with fractions; nil pointers are JSON nulls.
type Status struct {
	State               string   `json:"state"`
	Failures            int      `json:"failures"`
	OpenedAt            *float64 `json:"opened_at"`
	ReopenedAt          *float64 `json:"reopened_at"`
	Reopens             int      `json:"reopens"`
	OpenUntil           *float64 `json:"open_until"`
	Reason              string   `json:"reason"`
	Scope               Scope    `json:"scope"`
	BlockedUntil        *float64 `json:"blocked_until"`
	ProbesInFlight      int      `json:"probes_in_flight"`
	Forced              bool     `json:"forced"`
	PolicyVersion       string   `json:"policy_version"`
	WindowCalls         int64    `json:"window_calls"`
	WindowFailures      int64    `json:"window_failures"`
	WindowSlowCalls     int64    `json:"window_slow_calls"`
	ConsecutiveFailures int      `json:"consecutive_failures"`
	Generation          uint64   `json:"generation"`

	// Notable: open, half-open or Retry-After-blocked; only these appear
	// in R-API1.
	Notable bool `json:"-"`
}

func unixSec(ns int64) *float64 {
	if ns == 0 || ns == Never {
		return nil
	}
	v := math.Round(float64(ns)/1e6) / 1e3
	return &v
}

// Status returns the breaker's state under p at now, making due transitions
// first.
func (b *Breaker) Status(now int64, p *Policy) Status {
	var evs events
	b.mu.Lock()
	b.syncPolicy(now, p)
	b.advance(now, p, &evs)
	calls, fails, slow := b.rateWin.totals(now)
	s := Status{
		State: b.state.String(), Failures: b.failuresLocked(now, p),
		OpenedAt: unixSec(b.openedAt), ReopenedAt: unixSec(b.reopenedAt), Reopens: b.reopens,
		Reason: b.reason, Scope: b.id.Scope, BlockedUntil: unixSec(b.blockedUntil),
		ProbesInFlight: len(b.leases), Forced: b.forced, PolicyVersion: p.Version,
		WindowCalls: calls, WindowFailures: fails, WindowSlowCalls: slow,
		ConsecutiveFailures: b.consecutive, Generation: b.gen.Load(),
	}
	if b.state == Open {
		s.OpenUntil = unixSec(b.openUntil)
	}
	s.Notable = b.state != Closed || b.blockedUntil > now
	b.mu.Unlock()
	evs.emit(b.onEvent)
	return s
}

// ClosedStatus is the status of a breaker that has never recorded anything:
// closed, with the policy's version.
func ClosedStatus(scope Scope, p *Policy) Status {
	return Status{State: Closed.String(), Scope: scope, PolicyVersion: p.Version}
}
