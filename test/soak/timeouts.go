package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// What fusebox counts for a request Envoy stopped waiting for (R-DL14).
// Envoy goes on without the processor after a message timeout
// (failure_mode_allow) and half-closes its stream, so:
//   - a request that reached a route's provider and was answered whole,
//     but whose timed-out message was not the response's last (its headers
//     before a body, a chunk before the end), is a neither to fusebox, not a
//     success: fusebox never saw it end (R-O9), and Envoy's access log entry
//     carries no body (a 2xx entry is a neither). When the timed-out message
//     was the last, fusebox had the whole response and judged it: a success.
//     Any other answer (a 503, a 429, a cut) counts as the provider's tally
//     says, from the response or the entry;
//   - a request whose headers' reply timed out, its body still to come,
//     was never decided (fusebox decides on the body's model): nothing;
//   - a request Envoy sent elsewhere (it timed out before the route was
//     set: the default route serves it) is a neither on the route fusebox
//     had decided, at its wait's end. Envoy resets its stream right after
//     the half-close, so the reply that named the route is read only when
//     the close is graceful (the runtime guard ext_proc_graceful_grpc_close:
//     LateCluster); otherwise Envoy never heard of the route: the request
//     is unplaced, and its neither may fall on any route (or on none, when
//     fusebox had not decided yet). In the
//     observer profile that neither comes at decision_wait_sec (300 s),
//     after the run: nothing is counted for it within it.
type timeoutAdjust struct{ success, neither float64 }

func timeoutOutcomes(events []envoysim.TimeoutEvent, observer bool) (map[string]timeoutAdjust, int) {
	out := map[string]timeoutAdjust{}
	unplaced := 0
	for _, ev := range events {
		if route, ok := routeOf[ev.Cluster]; ok {
			if ev.Completed && !(ev.EndOfStream && strings.HasPrefix(ev.Phase, "response_")) {
				a := out[route]
				a.success--
				a.neither++
				out[route] = a
			}
			continue
		}
		if !decided(ev) || observer {
			// The body (the model) never reached fusebox: it decided
			// nothing, and counts nothing. In the observer profile the
			// decision waits decision_wait_sec (300 s: R-DL3) for an
			// observer that never comes, past the end of the run.
			continue
		}
		if route, ok := routeOf[ev.LateCluster]; ok {
			a := out[route]
			a.neither++
			out[route] = a
			continue
		}
		unplaced++
	}
	return out, unplaced
}

// explainOutcomes says what a failed exactly-once check needs to be
// understood without a rerun: every message timeout by its kind, and each
// route's neithers and successes by reason.
func explainOutcomes(events []envoysim.TimeoutEvent, got map[string]float64) string {
	kinds := map[string]int{}
	for _, ev := range events {
		k := fmt.Sprintf("%s/%s eos=%v cluster=%q late=%q completed=%v status=%d", ev.Role, ev.Phase, ev.EndOfStream, ev.Cluster, ev.LateCluster, ev.Completed, ev.Status)
		kinds[k]++
	}
	var parts []string
	for k, n := range kinds {
		parts = append(parts, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(parts)
	var counted []string
	for k, v := range got {
		if !strings.Contains(k, "|failure|") {
			counted = append(counted, fmt.Sprintf("%s=%v", k, v))
		}
	}
	sort.Strings(counted)
	return "timeouts: " + strings.Join(parts, ", ") + "; counted: " + strings.Join(counted, ", ")
}

// waitingPastTheRun is how many decisions may still be held for a
// decision_wait_sec (300 s, R-DL3) after the run, each by a message
// timeout it names: in the observer profile, a request whose body
// reached fusebox (it decided) and whose route Envoy never heard of
// (the reply timed out before it named one) waits for an observer that
// never comes. timeoutOutcomes counts nothing for it within the run; the
// decision table holds it until then. No other decision may be held.
func waitingPastTheRun(events []envoysim.TimeoutEvent, observer bool) int {
	if !observer {
		return 0
	}
	n := 0
	for _, ev := range events {
		if _, ok := routeOf[ev.Cluster]; !ok && decided(ev) {
			n++
		}
	}
	return n
}

// decided says whether fusebox had decided the request a message timeout
// hit: it decides on the body's model, so a request whose headers' reply
// timed out with its body still to come was never decided.
func decided(ev envoysim.TimeoutEvent) bool {
	return ev.Phase != "request_headers" || ev.EndOfStream
}
