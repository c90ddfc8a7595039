// Package processor owns fusebox's roles on Envoy's streams: thin adapters
// that read a message, call judge, plan and lifecycle, and write a reply.
//   - The route role (stream.go, request.go, decide.go, dispatch.go,
//     response.go): reads the gateway, model and residency, asks plan for
//     the route (R-D1..R-D8, R-F2, R-F3, R-M1..R-M4), replies with the
//     dispatch, and records the response as judge says (SPEC §4).
//   - The attempt role of in-request failover (attempt.go, meet.go, R-X*).
//   - The observer (observe.go, R-OB*) and the access log service
//     (accesslog.go, R-AL*).
//   - The decisions this replica holds until their outcome reaches it
//     (decisions.go, decision_wait.go, held.go), moved only by lifecycle's
//     tables; their note operations are lifecycle.Notes.
//   - The gRPC service itself (server.go): the stream limit and bounds
//     (with streamlife), the stall watch (stall.go), deployment
//     mismatches (mismatch.go).
//
// It reaches breaker state only through breaker.Store, speaks Envoy's wire
// through extproc as docs/envoy.md describes, and is imported by nothing
// but mainlib (TestImportDirection in test/layout): replay and the admin
// API use plan and judge directly.
package processor
