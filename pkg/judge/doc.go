// Package judge owns how a response becomes an outcome, with no I/O: the
// response headers parsed (headers.go) and judged on their status, Envoy's
// flags and details (classify_status.go, R-O1..R-O3, R-O5, R-O7, R-O12,
// R-O15), the local-reply sniff, the Retry-After deadline (retryafter.go),
// the providers' announced headroom and the saturation it implies
// (headroom.go, R-H1..R-H7), and the latency baseline of each route
// (baseline.go, R-T6, with the ramp share it holds, R-D8). Sub-package
// classify reads a 2xx body into what the attempt delivered.
//
// It imports only the breaker (the Result it fills) and extproc (header
// values and attributes as Envoy sends them); the roles in pkg/processor
// and replay call it (TestImportDirection in test/layout).
package judge
