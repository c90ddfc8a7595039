package processor

import (
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/plan"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

const headroomConfig = `
gateways:
  - id: default
    circuit_breaker: {enabled: true, headroom: {min_requests: 5, min_tokens: 1000}, max_retry_after_sec: 120}
    models:
      - name: gpt
        routes: ["openai:us:gpt", "azure:eu:gpt"]
      - name: shadowed
        routes: ["openai:us:sh", "azure:eu:sh"]
        circuit_breaker: {mode: shadow}
      - name: plain
        routes: ["openai:us:pl", "azure:eu:pl"]
        circuit_breaker: {headroom: null}
    routes:
      - {key: "openai:us:gpt", cluster: c_openai_us}
      - {key: "azure:eu:gpt", cluster: c_azure_eu}
      - {key: "openai:us:sh", cluster: c_sh1}
      - {key: "azure:eu:sh", cluster: c_sh2}
      - {key: "openai:us:pl", cluster: c_pl1}
      - {key: "azure:eu:pl", cluster: c_pl2}
`

// clusterOf routes one request of model and returns its cluster and the
// decision's stage.
func (e *env) clusterOf(model string) (cluster, action, skipped string) {
	e.t.Helper()
	c := e.open("")
	r := c.chat(model)
	c.end()
	cluster, _ = headerSet(e.t, common(r), "x-fusebox-cluster")
	action, skipped = stageOf(r)
	return cluster, action, skipped
}

// R-H2 (issue #38's "done when"): with headroom {min_requests: 5}, a
// response that announces 2 requests left sends the next request to
// another route, and the route comes back after the announced reset; the
// same for Anthropic's headers, for tokens, and a later response that
// announces enough ends it early. A reset 48 hours away parks the route
// for max_retry_after_sec, no longer. No failure is counted, and a model
// whose every route is saturated still routes (to the least saturated).
func TestSaturatedRouteIsPassedOver(t *testing.T) {
	in := func(d time.Duration) string { return testT0.Add(d).Format(time.RFC3339) }
	cases := []struct {
		name    string
		headers func(now time.Time) []string
		back    time.Duration // when the route takes requests again
	}{
		{"openai requests", func(time.Time) []string {
			return []string{"x-ratelimit-remaining-requests", "2", "x-ratelimit-reset-requests", "30s"}
		}, 30 * time.Second},
		{"openai tokens", func(time.Time) []string {
			return []string{"x-ratelimit-remaining-tokens", "400", "x-ratelimit-reset-tokens", "6m0s", "x-ratelimit-remaining-requests", "50"}
		}, 120 * time.Second}, // 6 min, capped at max_retry_after_sec
		{"anthropic requests", func(time.Time) []string {
			return []string{"anthropic-ratelimit-requests-remaining", "2", "anthropic-ratelimit-requests-reset", in(20 * time.Second)}
		}, 20 * time.Second},
		{"a reset 48 hours away is capped", func(time.Time) []string {
			return []string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "48h0m0s"}
		}, 120 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvConfig(t, headroomConfig)
			e.roundTrip("gpt", "200", nil, tc.headers(e.clk.Now())...)
			if s := e.status("default", "openai:us:gpt"); !s.Saturated || s.SaturatedUntil == nil || s.Failures != 0 || s.State != "closed" {
				t.Fatalf("after the announcement: %+v", s)
			}
			cluster, action, skipped := e.clusterOf("gpt")
			if cluster != "c_azure_eu" || action != plan.ActionSaturated || skipped != "openai:us:gpt" {
				t.Fatalf("the next request: %s, stage %q %q; want c_azure_eu, saturated openai:us:gpt", cluster, action, skipped)
			}
			e.clk.Advance(tc.back - time.Second)
			if cluster, _, _ := e.clusterOf("gpt"); cluster != "c_azure_eu" {
				t.Fatalf("a second before the reset: %s", cluster)
			}
			e.clk.Advance(time.Second)
			if cluster, action, _ := e.clusterOf("gpt"); cluster != "c_openai_us" || action != "" {
				t.Fatalf("at the reset: %s (%s), want the route back", cluster, action)
			}
			if v := testutil.ToFloat64(e.metrics.Decisions.WithLabelValues("default", "gpt", plan.ActionSaturated)); v != 2 {
				t.Fatalf("%v saturated decisions, want 2", v)
			}
		})
	}

	// R-H7 (#49): only news from after the quota ran down ends it. A
	// request sent before the saturation began (in flight when it began)
	// that answers "59 left" says nothing of the quota now: the route stays
	// saturated. Before, any later response ended it, and under concurrency
	// the route went straight back into an exhausted key.
	t.Run("an answer to an older request does not end it", func(t *testing.T) {
		e := newEnvConfig(t, headroomConfig)
		old := e.open("")
		if d := old.chat("gpt"); d.GetRequestBody() == nil {
			t.Fatalf("no decision: %v", d)
		}
		e.clk.Advance(time.Second)
		e.roundTrip("gpt", "200", nil, "x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "50s")
		e.clk.Advance(time.Second)
		old.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json", "x-ratelimit-remaining-requests", "59")
		old.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
		old.end()
		e.waitOutcomes("openai:us:gpt", "success", "success", 2)
		if s := e.status("default", "openai:us:gpt"); !s.Saturated {
			t.Fatalf("an answer to a request sent before the judge.Saturation ended it: %+v", s)
		}
	})

	t.Run("a later announcement of enough ends it", func(t *testing.T) {
		e := newEnvConfig(t, headroomConfig)
		e.roundTrip("gpt", "200", nil, "x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "50s")
		// A request sent after the saturation began (try_all, or the
		// last route left) comes back announcing the quota reset early
		// (a new minute).
		e.clk.Advance(time.Second)
		e.roundTripOn("openai:us:gpt", "x-ratelimit-remaining-requests", "59")
		if s := e.status("default", "openai:us:gpt"); s.Saturated {
			t.Fatalf("still saturated after 59 left: %+v", s)
		}
		if cluster, _, _ := e.clusterOf("gpt"); cluster != "c_openai_us" {
			t.Fatalf("%s", cluster)
		}
	})

	t.Run("every route saturated: the least saturated", func(t *testing.T) {
		e := newEnvConfig(t, headroomConfig)
		e.roundTripOn("openai:us:gpt", "x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "50s")
		e.roundTripOn("azure:eu:gpt", "x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "10s")
		if cluster, action, _ := e.clusterOf("gpt"); cluster != "c_azure_eu" || action != "" {
			t.Fatalf("%s (%s), want c_azure_eu (the earlier reset), routed as usual", cluster, action)
		}
	})

	t.Run("shadow lists it, never passes it over", func(t *testing.T) {
		e := newEnvConfig(t, headroomConfig)
		e.roundTrip("shadowed", "200", nil, "x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "50s")
		if cluster, action, skipped := e.clusterOf("shadowed"); cluster != "c_sh1" || action != plan.ActionWouldSkip || skipped != "openai:us:sh" {
			t.Fatalf("%s, %q %q", cluster, action, skipped)
		}
	})

	t.Run("headroom null: off", func(t *testing.T) {
		e := newEnvConfig(t, headroomConfig)
		e.roundTrip("plain", "200", nil, "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "50s")
		if cluster, _, _ := e.clusterOf("plain"); cluster != "c_pl1" {
			t.Fatalf("%s", cluster)
		}
	})
}

// roundTripOn sends one request to route (the model's other routes forced
// open for it) and answers 200 with the headers kv.
func (e *env) roundTripOn(route string, kv ...string) {
	e.t.Helper()
	others := map[string]string{"openai:us:gpt": "azure:eu:gpt", "azure:eu:gpt": "openai:us:gpt"}
	other := breaker.KeyOf(breaker.RouteID("default", others[route]))
	ctx := e.t.Context()
	now := e.clk.Now().UnixNano()
	if err := e.store.ForceOpen(ctx, other, now, time.Hour); err != nil {
		e.t.Fatal(err)
	}
	d := e.roundTrip("gpt", "200", nil, kv...)
	if got, _ := headerSet(e.t, common(d), "x-fusebox-route"); got != "" && got != route {
		e.t.Fatalf("routed to %s, want %s", got, route)
	}
	if err := e.store.ForceClose(ctx, other, now); err != nil {
		e.t.Fatal(err)
	}
}

// R-H1, R-H2 on the observer profile: the observer sees the response and
// saturates the route (the route role never sees it).
func TestObserverSaturatesTheRoute(t *testing.T) {
	e := newEnvConfig(t, "envoy: {observer: true}\n"+headroomConfig)
	c := e.open("")
	d := c.chat("gpt")
	c.end()
	e.observeWith(fuseboxMetadata(t, d), []string{":status", "200", "content-type", "application/json",
		"x-ratelimit-remaining-requests", "1", "x-ratelimit-reset-requests", "30s"}, `{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`)
	if s := e.status("default", "openai:us:gpt"); !s.Saturated {
		t.Fatalf("the observer did not saturate the route: %+v", s)
	}
	if cluster, action, _ := e.clusterOf("gpt"); cluster != "c_azure_eu" || action != plan.ActionSaturated {
		t.Fatalf("%s %s", cluster, action)
	}
}
