// Package processor owns the ext_proc gRPC service: the per-stream state
// machine of the route role, the routing decision, header and body
// mutations, and the classification of responses into breaker outcomes. It
// speaks Envoy's wire exactly as ../shared/ENVOY.md describes.
package processor
