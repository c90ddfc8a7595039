// Package replay is what-if replay (SPEC §13, R-R1..R-R3): it reads the
// access log lines the shipped Envoy configs write (or record-log's), and
// replays them in time order on a simulated clock through the real route
// compilation, route selection and breaker store under a candidate config,
// to tell what that config would have done with last week's traffic.
//
// A request the candidate routes where it did not go has no recorded
// outcome there: it is given that route's observed health at that time
// (the route's latest logged outcome before it, else a success) and every
// count that depends on it is labelled estimated.
package replay
