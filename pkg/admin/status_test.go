package admin

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

const statusCfg = `
fleets:
  - name: gpu
    circuit_breaker: {enabled: true, failure_threshold: 1}
gateways:
  - id: g
    circuit_breaker: {enabled: true, failure_threshold: 2, cooldown_ms: 10000}
    models:
      - name: m
        order: cheapest
        routes: ["a:r:m", "b:r:m", "self:r:m"]
    routes:
      - {key: "a:r:m", cluster: ca, cost_per_mtok: 3}
      - {key: "b:r:m", cluster: cb, cost_per_mtok: 1}
      - {key: "self:r:m", cluster: cs, cost_per_mtok: 2, fleet: gpu}
`

func TestStatusSnapshots(t *testing.T) {
	rt, err := routes.Parse([]byte(statusCfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := rt.Gateways["g"]
	st := breaker.NewMemory(nil)
	clk := breaker.NewFakeClock(time.Unix(1_800_000_000, 0))
	now := clk.Now().UnixNano()
	if _, _, err := st.Install(context.Background(), now, rt.BreakerSpecs()); err != nil {
		t.Fatal(err)
	}
	fail := func(id breaker.ID, _ *breaker.Policy, r breaker.Result) {
		k := breaker.KeyOf(id)
		adm, _, _ := st.Acquire(context.Background(), k, now, true)
		if _, err := st.Record(context.Background(), k, now, adm, r); err != nil {
			t.Fatal(err)
		}
	}
	ra := g.Routes["a:r:m"]
	fail(breaker.RouteID("g", ra.Key), ra.Policy, breaker.Result{Kind: breaker.KindStatus, Status: 500})
	fail(breaker.RouteID("g", ra.Key), ra.Policy, breaker.Result{Kind: breaker.KindStatus, Status: 500})
	rb := g.Routes["b:r:m"]
	fail(breaker.RouteID("g", rb.Key), rb.Policy, breaker.Result{Kind: breaker.KindStatus, Status: 429, RetryAfterUnixNano: now + 30e9})
	fl := rt.Fleets["gpu"]
	fail(breaker.FleetID("gpu"), fl.Policy, breaker.Result{Kind: breaker.KindConnError, Status: 503})

	cb := GatewayCircuitBreaker(g, st, now)
	if len(cb) != 3 {
		t.Fatalf("want a, b (blocked) and fleet:gpu, got %v", cb)
	}
	if s := cb["a:r:m"]; s.State != "open" || s.Failures != 2 || *s.OpenedAt != 1_800_000_000 || s.ReopenedAt != nil ||
		*s.OpenUntil != 1_800_000_010 || s.Scope != "gateway" || s.PolicyVersion != ra.Policy.Version || s.Reason != "provider_5xx" {
		t.Fatalf("a: %+v", s)
	}
	if s := cb["b:r:m"]; s.State != "closed" || s.BlockedUntil == nil || *s.BlockedUntil != 1_800_000_030 {
		t.Fatalf("b: %+v", s)
	}
	if s := cb["fleet:gpu"]; s.State != "open" || s.Scope != "global" || s.Reason != "connection_error" {
		t.Fatalf("fleet: %+v", s)
	}
	raw, _ := json.Marshal(cb)
	for _, field := range []string{`"state"`, `"failures"`, `"opened_at"`, `"reopened_at":null`, `"reopens"`, `"open_until"`,
		`"reason"`, `"scope"`, `"blocked_until"`, `"probes_in_flight"`, `"forced"`, `"policy_version"`} {
		if !strings.Contains(string(raw), field) {
			t.Errorf("R-API1 JSON lacks %s: %s", field, raw)
		}
	}

	rows := GatewayRoutes(g, st, nil, nil, now)
	var order []string
	for _, r := range rows {
		order = append(order, r.Route)
	}
	if strings.Join(order, ",") != "b:r:m,self:r:m,a:r:m" {
		t.Fatalf("routing order %v", order)
	}
	if rows[1].State != "closed" || rows[1].Model != "m" || rows[1].Provider != "self" || rows[1].Cluster != "cs" {
		t.Fatalf("closed route row %+v", rows[1])
	}
	raw, _ = json.Marshal(rows)
	for _, field := range []string{`"route"`, `"cluster"`, `"provider"`, `"model"`, `"window_calls"`, `"window_failures"`,
		`"window_slow_calls"`, `"consecutive_failures"`, `"generation"`} {
		if !strings.Contains(string(raw), field) {
			t.Errorf("R-API3 JSON lacks %s", field)
		}
	}
}
