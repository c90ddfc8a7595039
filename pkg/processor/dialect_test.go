package processor

import (
	"encoding/json"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

const dialectConfig = `
gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_threshold: 1, cooldown_ms: 60000, when_all_open: fail_fast}
    models:
      - {name: gpt, routes: ["openai:us:gpt"]}
      - {name: claude, routes: ["anthropic:us:claude"]}
      - name: gpt-retry
        routes: ["openai:us:gpt2"]
        circuit_breaker: {fail_fast_client_retry: true}
    routes:
      - {key: "openai:us:gpt", cluster: c1}
      - {key: "openai:us:gpt2", cluster: c3}
      - {key: "anthropic:us:claude", cluster: c2, api: anthropic}
`

// TestErrorsSpeakTheClientsDialect (R-D9, R-F3): every error fusebox
// answers itself is in Anthropic's shape for an Anthropic model, or for
// /v1/messages with no model known, and in OpenAI's otherwise (the
// Responses API too); the all-routes-open answer carries
// x-should-retry: false unless fail_fast_client_retry. Before, Anthropic
// clients got OpenAI's shape, and no answer said not to retry.
func TestErrorsSpeakTheClientsDialect(t *testing.T) {
	cases := []struct {
		name, path, body string
		open             string // route to open first
		status           int
		anthropic        bool
		typ              string // Anthropic error.type, or OpenAI error.code
		shouldRetry      string // x-should-retry ("" = absent)
	}{
		{"unknown model, chat", "/v1/chat/completions", `{"model":"nope","messages":[]}`, "", 404, false, "model_not_found", ""},
		{"unknown model, messages", "/v1/messages", `{"model":"nope","messages":[]}`, "", 404, true, "not_found_error", ""},
		{"unknown model, responses", "/v1/responses", `{"model":"nope","input":"hi"}`, "", 404, false, "model_not_found", ""},
		{"invalid JSON, messages", "/v1/messages", `{"model":`, "", 400, true, "invalid_request_error", ""},
		{"all routes open, anthropic model", "/v1/messages", `{"model":"claude","messages":[]}`, "anthropic:us:claude", 503, true, "overloaded_error", "false"},
		{"all routes open, openai model", "/v1/chat/completions", `{"model":"gpt","messages":[]}`, "openai:us:gpt", 503, false, "all_routes_open", "false"},
		{"all routes open, client retry allowed", "/v1/chat/completions", `{"model":"gpt-retry","messages":[]}`, "openai:us:gpt2", 503, false, "all_routes_open", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			rt, err := routes.Parse([]byte(dialectConfig), routes.Options{})
			if err != nil {
				t.Fatal(err)
			}
			e.holder.Store(rt)
			if tc.open != "" {
				e.forceOpen("default", tc.open)
			}
			c := e.open("")
			defer c.cancel()
			c.reqHeaders(false, "content-type", "application/json", ":path", tc.path)
			r := c.reqBody(tc.body)
			ir := r.GetImmediateResponse()
			if ir == nil || int(ir.Status.GetCode()) != tc.status {
				t.Fatalf("want an immediate %d, got %v", tc.status, r)
			}
			var body struct {
				Type  string
				Error struct{ Type, Message, Code string }
			}
			if err := json.Unmarshal(ir.Body, &body); err != nil || body.Error.Message == "" {
				t.Fatalf("body %s", ir.Body)
			}
			switch {
			case tc.anthropic && (body.Type != "error" || body.Error.Type != tc.typ || body.Error.Code != ""):
				t.Fatalf("want Anthropic's shape with %s: %s", tc.typ, ir.Body)
			case !tc.anthropic && (body.Type != "" || body.Error.Code != tc.typ || body.Error.Type == ""):
				t.Fatalf("want OpenAI's shape with code %s: %s", tc.typ, ir.Body)
			}
			got := ""
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				if h.Header.Key == "x-should-retry" {
					got = string(h.Header.RawValue)
				}
			}
			if got != tc.shouldRetry {
				t.Fatalf("x-should-retry %q, want %q", got, tc.shouldRetry)
			}
		})
	}
}
