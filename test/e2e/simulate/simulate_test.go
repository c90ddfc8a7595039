package simulate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// extproc simulate on an operator's own config: the outage of the model's
// first route opens its breaker after failure_threshold client errors,
// traffic moves to the next route, and after the cooldown the probe closes
// it and traffic returns; the timeline names the config's own clusters.
func TestSimulateOwnConfig(t *testing.T) {
	const cfg = `
gateways:
  - id: tenant-a
    circuit_breaker: {enabled: true, failure_threshold: 3, window_sec: 30, cooldown_ms: 5000}
    models:
      - name: claude
        routes: [anthropic:us:claude, bedrock:us-east-1:claude]
    routes:
      - {key: anthropic:us:claude, cluster: anthropic_direct, api: anthropic}
      - {key: bedrock:us-east-1:claude, cluster: bedrock_use1, api: anthropic}
`
	path := filepath.Join(t.TempDir(), "mine.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := Run(&out, Options{Config: path, Envoy: ownEnvoy(t), OutageAt: 2, RecoverAt: 6, PerSecond: 4}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		`gateway "tenant-a", model "claude"`, "anthropic_direct", "bedrock_use1",
		"closed->open (provider_5xx)", "half_open->closed (probe_success)",
		"3 of ", // failure_threshold client errors, then none
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the timeline lacks %q:\n%s", want, s)
		}
	}
}

// A config whose gateway has no model with two routes is refused with the
// reason.
func TestSimulateNeedsTwoRoutes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.yaml")
	_ = os.WriteFile(path, []byte("gateways:\n  - id: g\n    models: [{name: m, routes: [a:b:c]}]\n    routes: [{key: a:b:c, cluster: c}]\n"), 0o600)
	if err := Run(&strings.Builder{}, Options{Config: path}); err == nil || !strings.Contains(err.Error(), "two routes") {
		t.Fatalf("%v", err)
	}
}

// ownEnvoy is the operator's Envoy config of TestSimulateOwnConfig: the
// clusters its routes name.
func ownEnvoy(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	doc := "static_resources:\n  clusters:\n    - name: anthropic_direct\n    - name: bedrock_use1\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSimulateRefusesAMissingCluster (#37): simulate runs validate
// -envoy's check, so a route whose cluster the Envoy config lacks is
// refused with its line instead of simulated (the simulation gives every
// route a provider of its own, so before, a typo ran fine here and failed
// in production as Envoy's NC).
func TestSimulateRefusesAMissingCluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "typo.yaml")
	cfg := "gateways:\n  - id: g\n    models: [{name: m, routes: [a:b:c, d:e:f]}]\n    routes:\n      - {key: a:b:c, cluster: anthropic_direct}\n      - {key: d:e:f, cluster: bedrock_usel}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err := Run(&out, Options{Config: path, Envoy: ownEnvoy(t)})
	if err == nil || !strings.Contains(out.String(), path+`:6: gateways[0].routes[1].cluster: cluster "bedrock_usel"`) {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	// #54: without -envoy nothing is checked, and the simulation runs
	// (before, the shipped envoy.yaml was the default and refused these).
	out.Reset()
	if err := Run(&out, Options{Config: path, Duration: 4, OutageAt: 1, RecoverAt: 2}); err != nil || !strings.Contains(out.String(), "clusters not checked") {
		t.Fatalf("a config simulated with no Envoy config: %v\n%s", err, out.String())
	}
}

// #54: with -envoy, a route the simulation does not drive (another
// model's) whose cluster the Envoy config lacks is a warning, not a
// refusal.
func TestSimulateWarnsOnRoutesItDoesNotDrive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "two.yaml")
	cfg := "gateways:\n  - id: g\n    models: [{name: m, routes: [a:b:c, d:e:f]}, {name: n, routes: [x:y:z]}]\n    routes:\n" +
		"      - {key: a:b:c, cluster: anthropic_direct}\n      - {key: d:e:f, cluster: bedrock_use1}\n      - {key: x:y:z, cluster: elsewhere}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := Run(&out, Options{Config: path, Envoy: ownEnvoy(t), Model: "m", Duration: 4, OutageAt: 1, RecoverAt: 2}); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `warning: `+path+`:7: gateways[0].routes[2].cluster: cluster "elsewhere"`) {
		t.Fatalf("no warning for the route not driven:\n%s", out.String())
	}
}
