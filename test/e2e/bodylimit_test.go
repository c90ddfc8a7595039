package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// A request body over Envoy's buffer limit is answered 413 by Envoy after
// the route role decided (docs/envoy/stream.md): the client's request, not
// the route's health. However many, the route stays closed, no failure is
// counted, and the next request goes where it went before.
func TestBodyOverTheBufferLimitBlamesNoRoute(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil, func(c *envoysim.Config) { c.BufferLimit = 4096 })
	if r := chat(t, p, gpt, false); r.status != 200 || r.servedBy() != "openai_us" {
		t.Fatalf("healthy: %d %q", r.status, r.servedBy())
	}
	big := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, gpt, strings.Repeat("a", 8192))
	for i := range 6 {
		if r := do(t, p, "POST", "/v1/chat/completions", big); r.status != 413 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	// The API lists the breakers that are not closed.
	if b := w.admin("/admin/v1/gateways/default/circuit-breaker"); len(b) != 0 {
		t.Fatalf("413s of Envoy's moved a breaker: %v", b)
	}
	if m := w.scrape(); strings.Contains(m, `class="failure"`) || strings.Contains(m, `what="observe_no_decision"`) {
		t.Fatalf("a 413 of Envoy's counted against a route:\n%s", grep(m, "outcomes_total"))
	}
	t.Log(grep(w.scrape(), "outcomes_total"))
	if r := chat(t, p, gpt, false); r.status != 200 || r.servedBy() != "openai_us" {
		t.Fatalf("after the 413s: %d %q", r.status, r.servedBy())
	}
}
