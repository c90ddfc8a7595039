package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// R-AL4 end to end: Envoy's route timeout cuts an answer that had begun
// (a provider that stalls after its first token). The route role's
// stream (the observer's on that profile) just ends, as on a client
// cancel; Envoy writes the entry (UT) before it destroys the filters, and
// whichever of the two gRPC streams lands first, the neither is counted
// cut_mid_answer: a broken answer's label waits on its replica for the
// entry (processor/labelwait.go). Never a failure, and the breaker stays
// closed. Before, it was cut_mid_answer only when the entry landed first,
// and always client_cancel on the observer profile.
func TestRouteTimeoutCutsAFlowingAnswer(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil, func(c *envoysim.Config) { c.RouteTimeout = 300 * time.Millisecond })
	stall := make(chan struct{})
	defer close(stall)
	w.providers["openai_us"].SetFault(fakeprovider.Fault{StallAfterFirstToken: stall})
	for range 3 {
		chat(t, p, gpt, true)
	}
	neithers := func() int {
		return metricValue(w.scrape(), `aig_circuit_breaker_outcomes_total{class="neither",gateway="default",origin="",reason="cut_mid_answer",route="openai:us-east:gpt-4o-mini"}`)
	}
	eventually(t, "the cuts are recorded", func() bool { return neithers() >= 3 })
	m := w.scrape()
	if neithers() != 3 || strings.Contains(m, `class="failure"`) {
		t.Fatalf("three cut answers are not three neithers:\n%s", grep(m, "outcomes_total"))
	}
	if b := w.admin("/admin/v1/gateways/default/circuit-breaker"); len(b) != 0 {
		t.Fatalf("cut answers moved a breaker: %v", b)
	}
}
