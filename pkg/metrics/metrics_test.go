package metrics

import (
	"os"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The metric names are part of the contract (SPEC §9): dashboards depend on
// them.
func TestSpecNames(t *testing.T) {
	m := New()
	m.Transitions.WithLabelValues("g", "r", "p", "gateway", "closed->open", "provider_5xx").Inc()
	m.State.WithLabelValues("g", "r", "p", "gateway").Set(1)
	m.Outcomes.WithLabelValues("g", "r", "failure", "provider_5xx", breaker.OriginLabel("failure", "provider_5xx")).Inc()
	m.Decisions.WithLabelValues("g", "", "passthrough").Inc()
	m.ClusterNotFound.WithLabelValues("g", "c").Inc()
	m.MessageDuration.WithLabelValues("request_headers").Observe(0.001)
	m.DecisionEvents.WithLabelValues("observe", "duplicate").Inc()
	m.DeploymentMismatch.WithLabelValues("attempt_without_failover").Inc()
	m.RouteHeadroom.WithLabelValues("g", "r", "requests").Set(2)
	m.HeadroomIgnored.WithLabelValues("negative").Inc()
	m.StoreErrors.WithLabelValues("record").Inc()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string][]string{}
	for _, f := range families {
		var labels []string
		if len(f.Metric) > 0 {
			for _, l := range f.Metric[0].Label {
				labels = append(labels, l.GetName())
			}
		}
		have[f.GetName()] = labels
	}
	want := map[string]string{
		"aig_circuit_breaker_transitions_total": "gateway,provider,reason,route,scope,transition",
		"aig_circuit_breaker_state":             "gateway,provider,route,scope",
		"aig_circuit_breaker_outcomes_total":    "class,gateway,origin,reason,route", // origin: SPEC R-FD1
		"aig_circuit_breaker_decisions_total":   "action,gateway,model",
		"aig_extproc_cluster_not_found_total":   "cluster,gateway",
		"aig_extproc_message_duration_seconds":  "phase",
		"aig_extproc_streams_active":            "",
		"aig_store_errors_total":                "op",
		"aig_config_reloads_total":              "result",
		"aig_config_fallbacks_total":            "",
	}
	for name, labels := range want {
		got, ok := have[name]
		if !ok {
			t.Errorf("metric %s missing", name)
			continue
		}
		if strings.Join(got, ",") != labels {
			t.Errorf("%s labels %v, want %s", name, got, labels)
		}
	}
}

// docs/metrics.md, the metrics reference, names every series fusebox exports.
func TestMetricsPageListsEverySeries(t *testing.T) {
	readme, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	m := New()
	m.InternalErrors.WithLabelValues("panic").Inc()
	m.ConfigReloads.WithLabelValues("success").Inc()
	m.StoreErrors.WithLabelValues("record").Inc()
	m.Transitions.WithLabelValues("g", "r", "p", "gateway", "closed->open", "x").Inc()
	m.State.WithLabelValues("g", "r", "p", "gateway").Set(1)
	m.Outcomes.WithLabelValues("g", "r", "failure", "x", breaker.OriginLabel("failure", "x")).Inc()
	m.Decisions.WithLabelValues("g", "", "passthrough").Inc()
	m.ClusterNotFound.WithLabelValues("g", "c").Inc()
	m.MessageDuration.WithLabelValues("request_headers").Observe(0.001)
	m.DecisionEvents.WithLabelValues("observe", "duplicate").Inc()
	m.DeploymentMismatch.WithLabelValues("attempt_without_failover").Inc()
	m.RouteHeadroom.WithLabelValues("g", "r", "requests").Set(2)
	m.HeadroomIgnored.WithLabelValues("negative").Inc()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "go_") || strings.HasPrefix(f.GetName(), "process_") {
			continue
		}
		if !strings.Contains(string(readme), "| `"+f.GetName()+"` |") {
			t.Errorf("docs/metrics.md lacks %s", f.GetName())
		}
	}
}
