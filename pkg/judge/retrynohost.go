package judge

import "github.com/fusebox-llm/fusebox/pkg/breaker"

// A retry to a cluster Envoy does not have is a no-healthy-upstream reply,
// not NC: router.cc doRetry counts the attempt, looks the cluster up again
// (getThreadLocalCluster), finds none and calls
// sendNoHealthyUpstreamResponse, the same flag (UH) and details
// (no_healthy_upstream) as a cluster whose hosts are all gone
// (docs/envoy/stream-close.md). The entry cannot tell them apart; what
// fusebox can tell is whether Envoy ever reached that cluster. A cluster
// no entry has named since fusebox started is read as missing: a
// configuration error (R-O12), never the route's failure. One Envoy has
// reached is read as having no healthy host: a connection error (R-AL4).

// RetryToUnknownCluster reports whether an entry with flags for attempt
// (upstream_request_attempt_count; 0 when Envoy set none) is a retry's
// no-host reply to a cluster Envoy was never seen to reach (reached false).
func RetryToUnknownCluster(flags uint64, attempt uint32, reached bool) bool {
	return flags&FlagUH != 0 && flags&FlagNC == 0 && attempt > 1 && !reached
}

// AsClusterNotFound is res judged as R-O12's configuration error.
func AsClusterNotFound(res breaker.Result) breaker.Result {
	return breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClusterNotFound, ElapsedMs: res.ElapsedMs}
}
