package processor

import (
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/plan"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

const rampConfig = `
access_log: {wait_ms: 0}
gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_threshold: 1, cooldown_ms: 1000, recovery_ramp_sec: 60, recovery_ramp_start_percent: 10}
    models:
      - {name: gpt, routes: ["openai:us:gpt", "azure:eu:gpt"]}
      - {name: solo, routes: ["openai:us:gpt"]}
    routes:
      - {key: "openai:us:gpt", cluster: c_openai_us}
      - {key: "azure:eu:gpt", cluster: c_azure_eu}
`

// share sends n decisions for model and returns how many went to the
// first route's cluster, and the actions seen.
func (e *env) share(model string, n int) (first int, actions map[string]int) {
	e.t.Helper()
	actions = map[string]int{}
	for range n {
		c := e.open("")
		r := c.chat(model)
		c.end()
		if v, _ := headerSet(e.t, common(r), "x-fusebox-cluster"); v == "c_openai_us" {
			first++
		}
		a, _ := stageOf(r)
		actions[a]++
	}
	return first, actions
}

// R-D8 on the fake clock: after the probe closes the breaker, the route
// takes about 10 % of the requests it would get at the start of the ramp,
// about 55 % half way, all of it at the end; the rest go to the next route
// with action "ramped". Bounds are six standard deviations of n draws:
// they do not flake. A ramping route that is a model's only candidate
// takes everything; an open during the ramp ends it.
func TestRecoveryRamp(t *testing.T) {
	e := newEnvConfig(t, rampConfig)
	e.openRoute("default", "openai:us:gpt")
	e.clk.Advance(2 * time.Second) // half-open
	// The probe succeeds: closed, ramp begins.
	e.roundTrip("gpt", "200", attrs(0, "via_upstream"), "content-type", "application/json")
	if s := e.status("default", "openai:us:gpt"); s.State != "closed" || s.RampPercent == nil || *s.RampPercent != 10 {
		t.Fatalf("after the probe: %+v", s)
	}
	if n, err := testutil.GatherAndCount(e.metrics.Registry, "fusebox_route_ramp_ratio"); err != nil || n != 2 {
		t.Fatalf("ramp ratio series: %d %v", n, err)
	}
	if err := testutil.GatherAndCompare(e.metrics.Registry, strings.NewReader(`# HELP fusebox_route_ramp_ratio Share of the traffic a route would get that it takes (below 1 on its recovery ramp after a close).
# TYPE fusebox_route_ramp_ratio gauge
fusebox_route_ramp_ratio{gateway="default",route="azure:eu:gpt"} 1
fusebox_route_ramp_ratio{gateway="default",route="openai:us:gpt"} 0.1
`), "fusebox_route_ramp_ratio"); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	cases := []struct {
		at     time.Duration
		lo, hi int
		ramped bool
	}{
		{0, 100 - 57, 100 + 57, true},                // p 0.10: sd 9.5
		{30 * time.Second, 550 - 95, 550 + 95, true}, // p 0.55: sd 15.7
		{30 * time.Second, n, n, false},              // t+60 s: ramp over
	}
	for _, tc := range cases {
		e.clk.Advance(tc.at)
		first, actions := e.share("gpt", n)
		if first < tc.lo || first > tc.hi {
			t.Fatalf("at +%v: %d of %d to the ramping route, want %d..%d", tc.at, first, n, tc.lo, tc.hi)
		}
		if tc.ramped && actions[plan.ActionRamped] != n-first {
			t.Fatalf("at +%v: actions %v", tc.at, actions)
		}
	}
	if s := e.status("default", "openai:us:gpt"); s.RampPercent != nil {
		t.Fatalf("the ramp did not end: %v", *s.RampPercent)
	}

	// A new episode: the only candidate of a model takes everything even
	// while ramping; an open ends the ramp.
	e.openRoute("default", "openai:us:gpt")
	e.clk.Advance(2 * time.Second)
	e.roundTrip("gpt", "200", attrs(0, "via_upstream"), "content-type", "application/json")
	if first, _ := e.share("solo", 50); first != 50 {
		t.Fatalf("the only candidate took %d of 50 while ramping", first)
	}
	// The floor and when_all_open see a ramping route as healthy: with the
	// other route open it is the last candidate left and takes everything.
	e.openRoute("default", "azure:eu:gpt")
	if first, actions := e.share("gpt", 50); first != 50 || actions[plan.ActionRamped] != 0 {
		t.Fatalf("with the other route open the ramping one took %d of 50 (%v)", first, actions)
	}
	e.openRoute("default", "openai:us:gpt")
	if s := e.status("default", "openai:us:gpt"); s.RampPercent != nil || s.State != "open" {
		t.Fatalf("an open did not end the ramp: %+v", s)
	}
}

// R-DL9: a ramping route passes a request over only to a later candidate
// that can take it by its own health, never to one the capacity floor
// re-admitted while it is open. Before, right after the close, 90 of 100
// requests went to the open route the floor (max_ejection_percent 0) had
// re-admitted.
func TestRampNeverHandsTrafficToAnOpenRoute(t *testing.T) {
	cfg := strings.Replace(rampConfig, "recovery_ramp_start_percent: 10}", "recovery_ramp_start_percent: 10, max_ejection_percent: 0}", 1)
	e := newEnvConfig(t, cfg)
	e.openRoute("default", "openai:us:gpt")
	e.clk.Advance(2 * time.Second) // half-open
	e.roundTrip("gpt", "200", attrs(0, "via_upstream"), "content-type", "application/json")
	if s := e.status("default", "openai:us:gpt"); s.State != "closed" || s.RampPercent == nil {
		t.Fatalf("after the probe: %+v", s)
	}
	e.openRoute("default", "azure:eu:gpt")
	first, actions := e.share("gpt", 100)
	if first != 100 {
		t.Fatalf("%d of 100 went to the ramping route (actions %v); the rest went to an open route", first, actions)
	}
}
