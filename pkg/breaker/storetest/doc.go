// Package storetest is the contract every breaker.Store must keep: one suite
// of state-machine behaviour (transitions, windows, triggers, generations,
// the probe bound under concurrency, Retry-After, overrides, policy change,
// install and removal) run against each store through the Store interface
// only. The memory store runs it in its tests; the Redis store runs the same
// suite against a real redis-server.
package storetest
