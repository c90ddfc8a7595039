package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// sdkConfig: a default gateway with an OpenAI and an Anthropic model, and
// two gateways whose routes the test forces open: fail_fast as shipped,
// and fail_fast with fail_fast_client_retry (retry-after 1 s).
const sdkConfig = `
policies:
  standard: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 30000}
gateways:
  - id: default
    circuit_breaker: {policy: standard}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini]}
      - {name: claude, routes: [anthropic:us:claude]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: anthropic:us:claude, cluster: anthropic_us, api: anthropic}
  - id: failfast
    circuit_breaker: {policy: standard, when_all_open: fail_fast}
    models:
      - {name: gpt-4o-mini, routes: [openai:eu:gpt-4o-mini]}
      - {name: claude, routes: [anthropic:eu:claude]}
    routes:
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
      - {key: anthropic:eu:claude, cluster: anthropic_eu, api: anthropic}
  - id: retry
    circuit_breaker: {policy: standard, when_all_open: fail_fast, fail_fast_client_retry: true}
    models:
      - {name: gpt-4o-mini, routes: [openai:eu:gpt-4o-mini]}
    routes:
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
`

// TestOfficialSDKs (R-D9, R-F3): the official openai and @anthropic-ai/sdk
// packages (npm, pinned in test/sdk/package-lock.json) read fusebox's own
// answers, served through envoysim as Envoy serves them, as typed errors
// with readable messages; fail-fast returns in one attempt; a streamed
// answer reads to its end. Without Node the test is skipped, and with
// CI=true it fails. The Python SDKs are not reachable here (no PyPI): the
// Node packages are the reference clients.
func TestOfficialSDKs(t *testing.T) {
	node, err := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	if err != nil || err2 != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node and npm are needed for the SDK test (.ci/run installs them)")
		}
		t.Skip("node or npm is not installed")
	}
	dir, _ := filepath.Abs("../sdk")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/sdk: %v\n%s", err, out)
		}
	}
	w := newWorldConfig(t, sdkConfig)
	urls := map[string]string{}
	for _, gw := range []string{"default", "failfast", "retry"} {
		urls[gw] = w.proxy(gw, nil).URL()
	}
	urls["nogateway"] = w.proxy("nope", nil).URL() // a virtual host naming a gateway fusebox lacks
	for gw, routes := range map[string][]string{"failfast": {"openai:eu:gpt-4o-mini", "anthropic:eu:claude"}, "retry": {"openai:eu:gpt-4o-mini"}} {
		for _, r := range routes {
			body := `{"duration_sec": 600}`
			if gw == "retry" {
				body = `{"duration_sec": 1}` // retry-after 1 s (the fake clock stands still)
			}
			if code := w.post("/admin/v1/gateways/"+gw+"/routes/"+r+"/force-open", body); code != 200 {
				t.Fatalf("force-open %s %s: %d", gw, r, code)
			}
		}
	}
	cmd := exec.Command(node, "--test", "sdk.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FUSEBOX_SDK_DEFAULT="+urls["default"], "FUSEBOX_SDK_FAILFAST="+urls["failfast"], "FUSEBOX_SDK_RETRY="+urls["retry"],
		"FUSEBOX_SDK_NOGATEWAY="+urls["nogateway"])
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the SDK tests did not end within 2 minutes:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("the SDK tests failed: %v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())
}
