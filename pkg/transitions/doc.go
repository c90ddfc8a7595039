// Package transitions owns what a breaker transition becomes outside the
// breaker: the `[circuit_breaker]` log line, the transition and state
// metrics (SPEC §9), the saturation log lines (R-H4), and the journal
// entry kept for the dashboard's timeline, written to the fleet's journal
// off the path that reported it (reporter.go).
//
// It imports breaker and metrics only; the stores call it through
// breaker's event callback, and mainlib wires it.
package transitions
