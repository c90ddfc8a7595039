// Package bench compares fusebox's breaker with peer libraries in one run.
// It is its own module so that the peers never enter fusebox's go.mod.
package bench
