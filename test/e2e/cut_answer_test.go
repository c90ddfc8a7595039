package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// R-AL4 end to end: Envoy's route timeout cuts an answer that had begun
// (a provider that stalls after its first token). The route role's
// stream just ends, as on a client cancel; Envoy writes the entry (UT)
// before it destroys the filters, so the route role labels the neither
// cut_mid_answer when the entry reached fusebox first, client_cancel when
// its own stream's end did (two gRPC streams: either may land first).
// Either way it is a neither, never a failure, and the breaker stays
// closed.
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
		n := 0
		for _, l := range strings.Split(w.scrape(), "\n") {
			for _, r := range []string{"cut_mid_answer", "client_cancel"} {
				if strings.HasPrefix(l, `aig_circuit_breaker_outcomes_total{class="neither",gateway="default",reason="`+r+`",route="openai:us-east:gpt-4o-mini"} `) {
					v, _ := strconv.Atoi(l[strings.LastIndex(l, " ")+1:])
					n += v
				}
			}
		}
		return n
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
