// Package plan owns route selection as a pure function: from the verdicts
// of a model's candidates (in routing order), which route a request goes
// to, which are skipped, ramped or saturated and why (select.go, R-D2,
// R-D6, R-D8, R-F2, R-F3, R-H2), the decision's draw for the recovery ramp
// (RampDraw, deterministic so that replay draws the same), and the
// failover chain with the metadata Envoy's priority_group specifier reads
// (chain.go, R-X1, R-X8).
//
// It reads breaker verdicts and routes and does no I/O: the route role
// (pkg/processor), replay and the admin API's incident view all call the
// same plan, so that what they show is what fusebox does. It imports
// breaker, routes and extproc (the stage metadata) and nothing that
// imports it (TestImportDirection in test/layout).
package plan
