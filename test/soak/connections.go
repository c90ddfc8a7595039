package main

import "github.com/fusebox-llm/fusebox/test/e2e/envoysim"

// lostBeforeHeaders is the attempts on a provider's cluster that never had
// a connection or lost it before the response headers, from the counters
// Envoy gives an operator (docs/envoy/connection-failures.md):
// upstream_rq_pending_failure_eject, each request a connection that failed
// while connecting failed; plus upstream_cx_destroy_remote_with_active_rq,
// each connection the upstream closed under an incomplete response, less
// the access log's upstream_reset_after_response_started entries, the ones
// whose answer had begun. Exact, not a bound: every such attempt is in it
// once, and nothing else is.
func lostBeforeHeaders(s *envoysim.Stats, cluster string) int {
	c := "cluster." + cluster + "."
	return s.Get(c+"upstream_rq_pending_failure_eject") +
		s.Get(c+"upstream_cx_destroy_remote_with_active_rq") -
		s.Get("log.upstream_reset_after_response_started."+cluster)
}
