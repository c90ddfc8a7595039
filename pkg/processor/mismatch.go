package processor

import (
	"sync"
	"time"
)

// A deployment mismatch is loud (SPEC R-DL10): a stream of a role the
// envoy section does not deploy means the Envoy config and fusebox's
// disagree, and one of them records nothing or everything twice. Before,
// envoy-failover.yaml run with envoy.failover false made ten attempts on
// route 1 without a word.

// The mismatches fusebox_deployment_mismatch_total{what} counts.
const (
	MismatchAttempt        = "attempt_without_failover"
	MismatchObserver       = "observer_without_observer"
	MismatchResponseInFail = "response_phases_in_failover"
)

var mismatchHelp = map[string]string{
	MismatchAttempt:        "an attempt-role stream (x-fusebox-role: attempt) arrived while envoy.failover is false: set envoy.failover: true for envoy/envoy-failover.yaml, or remove the attempt-role filters",
	MismatchObserver:       "an observer stream (x-fusebox-role: observe) arrived while envoy.observer is false: its responses are not recorded; set envoy.observer: true for envoy/envoy-observer.yaml",
	MismatchResponseInFail: "the route role was sent response phases while envoy.failover is true: the attempt role records every attempt, so the route role's filter must not process responses (envoy/envoy-failover.yaml)",
}

// mismatches remembers what was seen, for the log's rate and /readyz.
type mismatches struct {
	mu     sync.Mutex
	logged map[string]time.Time
	seen   map[string]uint64
}

// mismatch counts what, logs it at most once a minute, and tells the
// server's listener (readiness details).
func (s *Server) mismatch(what string) {
	s.metrics.DeploymentMismatch.WithLabelValues(what).Inc()
	now := time.Now()
	m := &s.mism
	m.mu.Lock()
	if m.logged == nil {
		m.logged, m.seen = map[string]time.Time{}, map[string]uint64{}
	}
	m.seen[what]++
	log := now.Sub(m.logged[what]) >= time.Minute
	if log {
		m.logged[what] = now
	}
	m.mu.Unlock()
	if log {
		s.log.Error("deployment mismatch: the Envoy config and fusebox's envoy section disagree", "what", what, "fix", mismatchHelp[what])
		if s.onMismatch != nil {
			s.onMismatch(what, mismatchHelp[what])
		}
	}
}

// Mismatches reports how many streams of each mismatch were seen.
func (s *Server) Mismatches() map[string]uint64 {
	m := &s.mism
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]uint64, len(m.seen))
	for k, v := range m.seen {
		out[k] = v
	}
	return out
}
