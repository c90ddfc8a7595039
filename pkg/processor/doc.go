// Package processor owns the ext_proc gRPC service of the route role: the
// per-stream state in three phases (request.go reads the gateway, model and
// residency; decide.go and select.go choose the route, R-D1..R-D7, R-F2,
// R-F3, R-M1..R-M4; dispatch.go builds the reply; response.go parses,
// judges and replies to the response), the classification of responses
// into one breaker.Result per attempt (with package classify), and the
// transition reporter.
//
// It reaches breaker state only through breaker.Store, and it speaks
// Envoy's wire as docs/envoy.md describes.
package processor
