package routes

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The effective config is a valid config with the same resolved policies.
func TestEffectiveRoundTrips(t *testing.T) {
	for _, doc := range []string{string(defaultYAML), cfg("{failure_threshold: 3, window: sliding}", "{cooldown_ms: 5000}", "{failure_status_codes: [500, 429]}")} {
		rt := mustParse(t, doc)
		out, err := yaml.Marshal(rt.Effective())
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out, Options{})
		if err != nil {
			t.Fatalf("the effective config does not load: %v\n%s", err, out)
		}
		for _, id := range rt.GatewayIDs {
			for _, r := range rt.Gateways[id].RouteList {
				if got := again.Gateways[id].Routes[r.Key].Policy.Version; got != r.Policy.Version {
					t.Fatalf("route %s: policy %s, want %s", r.Key, got, r.Policy.Version)
				}
			}
		}
	}
	rt := mustParse(t, strings.Replace(string(defaultYAML), "backend: memory", "backend: memory\n  redis: {url: \"redis://u:secret@h:6379/0\"}", 1))
	out, _ := yaml.Marshal(rt.Effective())
	if strings.Contains(string(out), "secret") {
		t.Fatal("the effective config prints the Redis password")
	}
}

// docs/configuration.md, the field reference, documents every circuit_breaker field.
func TestConfigurationPageDocumentsEveryPolicyField(t *testing.T) {
	readme, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range PolicyFieldNames() {
		if !strings.Contains(string(readme), "| `"+f+"` |") {
			t.Errorf("docs/configuration.md lacks circuit_breaker.%s", f)
		}
	}
}
