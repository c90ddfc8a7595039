package admin

import (
	"context"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// RouteRow is one element of R-API3: a route with its breaker's status,
// closed routes included.
type RouteRow struct {
	Route    string `json:"route"`
	Cluster  string `json:"cluster"`
	Provider string `json:"provider"`
	Model    string `json:"model"`
	// FailureThreshold is the route's policy's, for "failures/threshold".
	FailureThreshold int `json:"failure_threshold"`
	// LatencyBaselineMs is the route's p50 of successes over 15 minutes
	// (R-T6), 0 when it has none (or no slow_call_baseline_multiplier).
	LatencyBaselineMs int64 `json:"latency_baseline_ms"`
	breaker.Status
	// History is the route's outcomes per 10 s over the last 5 minutes,
	// oldest first (the dashboard's sparkline).
	History []breaker.HistoryPoint `json:"history"`
}

// statusOf returns a breaker's status from the store. A breaker the store
// cannot report (a shared store that is down, or a config being swapped)
// reads as closed under its configured policy.
func statusOf(st breaker.Store, id breaker.ID, p *breaker.Policy, now int64) breaker.Status {
	s, err := st.Status(context.Background(), breaker.KeyOf(id), now)
	if err != nil {
		return breaker.ClosedStatus(id.Scope, p)
	}
	return s
}

// GatewayCircuitBreaker is the R-API1 object: route key (and "fleet:<name>"
// for fleets the gateway's routes use) → status, only for breakers that are
// open or half-open and routes that are Retry-After-blocked.
func GatewayCircuitBreaker(g *routes.Gateway, st breaker.Store, now int64) map[string]breaker.Status {
	out := map[string]breaker.Status{}
	for _, r := range g.RouteList {
		if s := statusOf(st, breaker.RouteID(g.ID, r.Key), r.Policy, now); s.Notable {
			out[r.Key] = s
		}
		if r.Fleet != nil {
			if _, done := out[r.Fleet.BreakerKey()]; !done {
				if s := statusOf(st, breaker.FleetID(r.Fleet.Name), r.Fleet.Policy, now); s.Notable {
					out[r.Fleet.BreakerKey()] = s
				}
			}
		}
	}
	return out
}

// GatewayRoutes is the R-API3 array: every route of the gateway, models in
// file order and each model's candidates in routing order, then routes no
// model uses.
func GatewayRoutes(g *routes.Gateway, st breaker.Store, h *breaker.History, baseline func(breaker.ID, int64) int64, now int64) []RouteRow {
	rows := make([]RouteRow, 0, len(g.RouteList))
	seen := map[string]bool{}
	add := func(r *routes.Route, model string) {
		if seen[r.Key] {
			return
		}
		seen[r.Key] = true
		id := breaker.RouteID(g.ID, r.Key)
		rows = append(rows, RouteRow{
			Route: r.Key, Cluster: r.Cluster, Provider: r.Provider, Model: model, FailureThreshold: r.Policy.FailureThreshold,
			Status: statusOf(st, id, r.Policy, now), History: h.Points(id, now, breaker.SparkBuckets),
		})
		if baseline != nil {
			rows[len(rows)-1].LatencyBaselineMs = baseline(id, now)
		}
	}
	for _, name := range g.ModelNames {
		for _, r := range g.Models[name].Candidates(nil) {
			add(r, name)
		}
	}
	for _, r := range g.RouteList {
		add(r, "")
	}
	return rows
}

// FleetStatus returns the status of one fleet breaker.
func FleetStatus(f *routes.Fleet, st breaker.Store, now int64) breaker.Status {
	return statusOf(st, breaker.FleetID(f.Name), f.Policy, now)
}
