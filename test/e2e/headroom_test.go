package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// headroomConfig: one model on two OpenAI routes, the first with a quota
// its provider announces; headroom {min_requests: 3} (HEADROOM is
// replaced: the floor, or null for off).
const headroomConfig = `
policies:
  standard: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 30000, headroom: HEADROOM}
gateways:
  - id: default
    circuit_breaker: {policy: standard}
    models:
      - name: gpt-4o-mini
        routes: [openai:us-east:gpt-4o-mini, openai:eu:gpt-4o-mini]
      - name: claude
        routes: [anthropic:us:claude, anthropic:eu:claude]
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
      - {key: anthropic:us:claude, cluster: anthropic_us, api: anthropic}
      - {key: anthropic:eu:claude, cluster: anthropic_eu, api: anthropic}
`

// TestHeadroomRoutesAroundAQuota (#38, R-H1..R-H3): two replicas behind
// one envoysim; the first route's provider allows 10 requests a minute and
// says so on every answer (OpenAI's headers; Anthropic's for claude).
// With headroom {min_requests: 3} the clients see no 429 in 30 requests:
// each replica passes the route over once its provider announced fewer
// than 3 left (on Redis the first to see it passes it over for the
// fleet), and the other route takes the rest; the route comes back when
// the minute rolls. With headroom off the same traffic meets the quota
// (429s to the clients). On memory and on Redis.
func TestHeadroomRoutesAroundAQuota(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		for _, model := range []struct{ name, first, body string }{{gpt, "openai_us", ""}, {"claude", "anthropic_us", "anthropic"}} {
			for _, on := range []bool{true, false} {
				name := fmt.Sprintf("%s/%s/headroom %v", store, model.name, on)
				t.Run(name, func(t *testing.T) {
					floor := "null"
					if on {
						floor = "{min_requests: 3}"
					}
					replicas := 2
					if observerProfile && store == "memory" {
						// The observer stream and the route role's may land
						// on different replicas and meet in the store
						// (docs/observer.md): replicas on memory stores
						// share none, so an observer profile fleet needs
						// Redis. One replica on memory here.
						replicas = 1
					}
					w := newFleetOn(t, replicas, strings.Replace(headroomConfig, "HEADROOM", floor, 1), store == "redis")
					cfg := w.deployment("default", nil)
					w.fleetHosts(&cfg)
					p := w.startProxy(cfg)
					w.providers[model.first].SetQuota(fakeprovider.Quota{Requests: 10, Window: time.Minute, Now: w.clk.Now})
					send := func() reply {
						if model.body == "anthropic" {
							return do(t, p, "POST", "/v1/messages", `{"model":"claude","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)
						}
						return chat(t, p, model.name, false)
					}
					tooMany := 0
					for i := 0; i < 30; i++ {
						r := send()
						switch {
						case r.status == 429:
							tooMany++
						case r.status != 200:
							t.Fatalf("request %d: %d", i, r.status)
						}
					}
					served := w.providers[model.first].Served()
					if on {
						if tooMany != 0 {
							t.Fatalf("%d clients got a 429 with headroom on and another route with room (the quota's route served %d)", tooMany, served)
						}
						if served < 7 || served > 10 {
							t.Fatalf("the quota's route served %d of its 10, want it used up to the floor", served)
						}
						// The minute rolls: the route takes requests again.
						w.clk.Advance(time.Minute)
						eventually(t, "the route back after the reset", func() bool {
							return send().servedBy() == model.first
						})
						return
					}
					if tooMany == 0 {
						t.Fatalf("no 429 with headroom off: the scenario proves nothing (the quota's route served %d)", served)
					}
				})
			}
		}
	}
}
