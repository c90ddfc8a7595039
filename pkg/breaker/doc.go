// Package breaker owns the circuit breaker: the resolved Policy, the state
// machine (R-S1..R-S6), the failure windows and triggers (R-W*, R-T*),
// half-open probes, backoff, Retry-After blocks (R-A1), fleets, the injected
// clock, the Store interface and its in-memory implementation.
//
// Breaker state lives only inside a Store: callers install policies once per
// configuration (Store.Install) and then speak to breakers by Key, with a
// context and an error on every operation a remote store performs. The
// contract every Store keeps is the suite in package storetest.
//
// It must not know about Envoy, HTTP or configuration files.
package breaker
