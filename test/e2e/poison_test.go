package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// poisonConfig: the failover gateway with two routes of one model, and a
// second model that sends its requests to azure first, so that both routes
// answer other clients' requests.
const poisonConfig = `
policies:
  standard: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 30000}
gateways:
  - id: failover
    circuit_breaker: {policy: standard}
    failover: {max_attempts: 2}
    models:
      - name: gpt-4o-mini
        routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini]
      - name: gpt-4o-mini-eu
        routes: [azure:eu-west:gpt-4o-mini, openai:us-east:gpt-4o-mini]
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: azure:eu-west:gpt-4o-mini, cluster: azure_eu, upstream_model: gpt4o-mini-deploy, path: "/openai/deployments/gpt4o-mini-deploy/chat/completions?api-version=2024-10-21"}
`

// Whose failure is it (R-FD4): a poison request (both providers answer it
// 500 with the same error, and every other request 200) sent by a client
// whose SDK retries it twice, each time through failover to the second
// route: the client gets the provider's error, every other client is
// served, and no route opens (one failure counted, the first: nothing yet
// said it was the request's). The same 500 for every request still opens
// the route at the threshold. On the memory store, and on Redis with the
// attempts spread over two replicas (they meet through the store's notes).
// Before, one poison request retried twice was six failures on two routes
// and opened both.
func TestAPoisonRequestOpensNoRoute(t *testing.T) {
	for _, onRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "memory", true: "redis, two replicas"}[onRedis], func(t *testing.T) {
			cfg := "envoy: {failover: true}\n" + poisonConfig
			var w *world
			if onRedis {
				w = newFleet(t, 2, cfg)
			} else {
				w = newWorldConfig(t, cfg)
			}
			pc := w.failoverConfig()
			if onRedis {
				w.fleetHosts(&pc)
			}
			p := w.startProxy(pc)
			for i := range 6 {
				for _, m := range []string{gpt, "gpt-4o-mini-eu"} {
					if r := chat(t, p, m, i%2 == 0); r.status != 200 {
						t.Fatalf("warm %s %d: %d %s", m, i, r.status, r.body)
					}
				}
			}
			poison := fakeprovider.Fault{Status: 500, OnlyBodyContaining: "POISON"}
			w.providers["openai_us"].SetFault(poison)
			w.providers["azure_eu"].SetFault(poison)
			body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"POISON"}]}`
			for retry := range 3 {
				r := do(t, p, "POST", "/v1/chat/completions", body, "x-stainless-retry-count", fmt.Sprint(retry))
				if r.status != 500 {
					t.Fatalf("the poison request (retry %d): %d %s, want the provider's 500", retry, r.status, r.body)
				}
				// Other clients are untouched, on both routes.
				for _, m := range []string{gpt, "gpt-4o-mini-eu"} {
					if r := chat(t, p, m, false); r.status != 200 {
						t.Fatalf("another client's %s after poison retry %d: %d %s", m, retry, r.status, r.body)
					}
				}
			}
			const faults = `fusebox_request_faults_total{gateway="failover",model="gpt-4o-mini"}`
			deadline := time.Now().Add(15 * time.Second)
			for w.fleetSum(faults) != 5 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := w.fleetSum(faults); n != 5 {
				var out []string
				for _, a := range w.adminAddrs() {
					out = append(out, grep(scrapeAddr(t, a), "outcomes_total{class=\"")+grep(scrapeAddr(t, a), "request_faults"))
				}
				t.Fatalf("%v of six attempts judged the request's, want 5:\n%s", n, strings.Join(out, "\n---\n"))
			}
			for _, a := range w.adminAddrs() {
				for _, route := range []string{"openai:us-east:gpt-4o-mini", "azure:eu-west:gpt-4o-mini"} {
					if b := adminBreaker(t, a, "failover", route); b != nil {
						t.Fatalf("%s on %s after a poison request: %v", route, a, b)
					}
				}
			}
			// The same 500 for every request is an outage: OpenAI opens at
			// the threshold (failover serves the clients from azure).
			w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 500})
			for i := range 4 {
				if r := chat(t, p, gpt, false); r.status != 200 || r.servedBy() != "azure_eu" {
					t.Fatalf("outage request %d: %d from %q", i, r.status, r.servedBy())
				}
			}
			eventually(t, "OpenAI open at the threshold", func() bool {
				b := adminBreaker(t, w.adminAddrs()[0], "failover", "openai:us-east:gpt-4o-mini")
				return b != nil && b["state"] == "open" && strings.HasPrefix(fmt.Sprint(b["reason"]), "provider_5xx")
			})
		})
	}
}
