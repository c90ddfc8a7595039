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
	if err := Run(&out, Options{Config: path, OutageAt: 2, RecoverAt: 6, PerSecond: 4}); err != nil {
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
