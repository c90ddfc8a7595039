package deploy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// alertExpr is the expression of alert name in deploy/prometheus/alerts.yml.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	groups, errs := parseRules(read(t, "deploy/prometheus/alerts.yml"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return strings.Join(strings.Fields(r.Expr), " ")
			}
		}
	}
	t.Fatalf("no alert %s", name)
	return ""
}

// #54: the alerts evaluated by Prometheus's own engine on series as
// fusebox and the chart's ServiceMonitor export them. A breaker open in
// shadow mode (it routes nothing, R-M2) does not page; one in prod does
// (before, both did). FuseboxDown fires on the job the chart's
// ServiceMonitor now sets.
func TestAlertsFireOnWhatTheyShould(t *testing.T) {
	open := alertExpr(t, "FuseboxBreakerOpenTooLong")
	down := alertExpr(t, "FuseboxDown")
	input := fmt.Sprintf(`
load 1m
	aig_circuit_breaker_state{gateway="g",route="a:r:m",provider="a",scope="gateway"} 1x10
	aig_circuit_breaker_state{gateway="g",route="b:r:m",provider="b",scope="gateway"} 1x10
	aig_circuit_breaker_state{gateway="g",route="c:r:m",provider="c",scope="gateway"} 0x10
	fusebox_breaker_mode{gateway="g",route="a:r:m",scope="gateway",mode="prod"} 1x10
	fusebox_breaker_mode{gateway="g",route="b:r:m",scope="gateway",mode="shadow"} 1x10
	fusebox_breaker_mode{gateway="g",route="c:r:m",scope="gateway",mode="prod"} 1x10
	up{job="fusebox",instance="10.0.0.1:8090"} 0x10
	up{job="fusebox",instance="10.0.0.2:8090"} 1x10

eval instant at 5m %s
	{gateway="g",route="a:r:m",provider="a",scope="gateway"} 1

eval instant at 5m %s
	up{job="fusebox",instance="10.0.0.1:8090"} 0
`, open, down)
	promqltest.RunTest(t, input, promqltest.NewTestEngine(t, false, 5*time.Minute, 10000))
}
