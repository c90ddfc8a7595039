// Package breaker owns the circuit breaker: the resolved Policy, the state
// machine (R-S1..R-S6), the failure windows and triggers (R-W*, R-T*),
// half-open probes, backoff, Retry-After blocks (R-A1), fleets, the injected
// clock, the Store interface and its in-memory implementation.
//
// It must not know about Envoy, HTTP or configuration files: callers hand it
// policies and outcomes and ask it for admissions.
package breaker
