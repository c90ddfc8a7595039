package main

import (
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// Only the observer profile holds a decision past the run for a message
// timeout, and only one whose route Envoy never heard of and whose body
// reached fusebox (it decided): each such timeout explains one decision
// the table may still hold, no other does.
func TestWaitingPastTheRun(t *testing.T) {
	events := []envoysim.TimeoutEvent{
		{Role: "route", Phase: "request_body", EndOfStream: true, Cluster: "default"},                           // decided, route unknown to Envoy: waits
		{Role: "route", Phase: "request_headers", EndOfStream: false, Cluster: "default"},                       // never decided
		{Role: "route", Phase: "request_body", EndOfStream: true, Cluster: "openai_us"},                         // Envoy knew the route: counted in the run
		{Role: "route", Phase: "request_body", EndOfStream: true, Cluster: "default", LateCluster: "openai_us"}, // waits too
	}
	for _, tc := range []struct {
		observer bool
		want     int
	}{{false, 0}, {true, 2}} {
		if got := waitingPastTheRun(events, tc.observer); got != tc.want {
			t.Errorf("observer %v: %d decisions explained, want %d", tc.observer, got, tc.want)
		}
	}
}
