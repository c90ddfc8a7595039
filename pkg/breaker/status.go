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
	// RampPercent is the share of its traffic a closed route takes on its
	// recovery ramp (R-D8); null when not ramping.
	RampPercent *float64 `json:"ramp_percent"`
	// Saturated: the provider announced less quota than the route's
	// headroom floors, until SaturatedUntil (R-H2, R-H4).
	Saturated      bool     `json:"saturated"`
	SaturatedUntil *float64 `json:"saturated_until"`
	// ReplicaScope is this replica's own open of the route (R-FD3): its
	// locally originated failures, below the fleet's quorum; nil when
	// there is none.
	ReplicaScope *ReplicaScope `json:"replica_scope,omitempty"`

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

// status returns the breaker's state at now, making due transitions first.
func (m *machine) status(now int64) Status {
	var evs events
	m.mu.Lock()
	m.advance(now, &evs)
	p := m.policy
	calls, fails, slow := m.rateWin.totals(now)
	s := Status{
		State: m.state.String(), Failures: m.failuresLocked(now, p),
		OpenedAt: unixSec(m.openedAt), ReopenedAt: unixSec(m.reopenedAt), Reopens: m.reopens,
		Reason: m.reason, Scope: m.id.Scope, BlockedUntil: unixSec(m.blockedUntil),
		ProbesInFlight: len(m.leases), Forced: m.forced, PolicyVersion: p.Version,
		WindowCalls: calls, WindowFailures: fails, WindowSlowCalls: slow,
		ConsecutiveFailures: m.consecutive, Generation: m.gen,
	}
	if m.state == Open {
		s.OpenUntil = unixSec(m.openUntil)
	}
	if r := m.rampLocked(now); r > 0 {
		v := float64(r) / 10
		s.RampPercent = &v
	}
	if m.saturatedUntil > now {
		s.Saturated, s.SaturatedUntil = true, unixSec(m.saturatedUntil)
	}
	s.Notable = m.state != Closed || m.blockedUntil > now || s.Saturated
	m.unlock(&evs)
	return s
}

// ClosedStatus is the status of a breaker that has never recorded anything:
// closed, with the policy's version.
func ClosedStatus(scope Scope, p *Policy) Status {
	return Status{State: Closed.String(), Scope: scope, PolicyVersion: p.Version}
}

// ReplicaScope is a route's open on one replica alone (R-FD3): Envoy on
// that replica got no answer from the provider (its egress, not the
// provider, may be at fault), and too few replicas saw the same for the
// fleet to open it.
type ReplicaScope struct {
	Replica   string   `json:"replica"`
	State     string   `json:"state"`
	Reason    string   `json:"reason"`
	OpenedAt  *float64 `json:"opened_at"`
	OpenUntil *float64 `json:"open_until"`
	Reopens   int      `json:"reopens"`
	Failures  int      `json:"failures"`
}

// ReplicaScopeOf is the replica scope of st, a status of replica's own
// view of its egress; nil when that view is closed.
func ReplicaScopeOf(replica string, st Status) *ReplicaScope {
	if st.State == Closed.String() && !st.Notable {
		return nil
	}
	return &ReplicaScope{Replica: replica, State: st.State, Reason: st.Reason, OpenedAt: st.OpenedAt,
		OpenUntil: st.OpenUntil, Reopens: st.Reopens, Failures: st.Failures}
}
