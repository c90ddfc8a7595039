package simulate

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
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

// scenarioConfig is a config whose first route trips fast, for the
// scenarios of #53 (R-FD5).
const scenarioConfig = `
gateways:
  - id: g
    circuit_breaker: {enabled: true, failure_threshold: 3, window_sec: 30, cooldown_ms: 5000, request_fault_ttl_sec: TTL}
    models:
      - {name: m, routes: [openai:us:m, azure:eu:m]}
    routes:
      - {key: openai:us:m, cluster: openai_us}
      - {key: azure:eu:m, cluster: azure_eu}
`

func scenarioFile(t *testing.T, ttl string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(scenarioConfig, "TTL", ttl, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSimulatePoison (#53 item 6): a poison request its SDK retries twice
// each second, beside requests the route serves, opens no route: its
// failures are judged its own. With request_fault_ttl_sec 0 the same
// traffic opens the route, so the scenario tells the two apart.
func TestSimulatePoison(t *testing.T) {
	for _, tc := range []struct {
		ttl   string
		opens bool
	}{{"600", false}, {"0", true}} {
		t.Run("request_fault_ttl_sec "+tc.ttl, func(t *testing.T) {
			var out strings.Builder
			if err := Run(&out, Options{Config: scenarioFile(t, tc.ttl), Scenario: "poison", OutageAt: 2, RecoverAt: 8, Duration: 10, PerSecond: 3}); err != nil {
				t.Fatal(err)
			}
			s := out.String()
			if got := strings.Contains(s, "closed->open (provider_5xx)"); got != tc.opens {
				t.Fatalf("the route opened: %v, want %v:\n%s", got, tc.opens, s)
			}
			if !strings.Contains(s, "a poison request: openai_us answers 500 to one request only") || !strings.Contains(s, "judged its own") {
				t.Fatalf("the timeline does not say what it ran:\n%s", s)
			}
			m := regexp.MustCompile(`failed (\d+) times; (\d+) of its failures were judged its own`).FindStringSubmatch(s)
			if m == nil || m[1] == "0" || (m[2] == "0") != tc.opens {
				t.Fatalf("the poison's failures and those judged its own: %v (want some judged: %v):\n%s", m, !tc.opens, s)
			}
		})
	}
}

// TestSimulateEgress (#53 item 6): two pods on one Redis; pod A cannot
// reach the first route. Pod A's own view opens and routes its requests
// elsewhere; the fleet's breaker never opens, and pod B keeps using the
// route.
func TestSimulateEgress(t *testing.T) {
	redistest.Need(t, "redis-server")
	var out strings.Builder
	if err := Run(&out, Options{Config: scenarioFile(t, "600"), Scenario: "egress", OutageAt: 2, RecoverAt: 8, Duration: 10, PerSecond: 3}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	if !strings.Contains(s, "closed->open (connection_error, one replica's own view)") || !strings.Contains(s, "closed (A own: open)") {
		t.Fatalf("pod A's own view did not open:\n%s", s)
	}
	for _, ln := range strings.Split(s, "\n") {
		if strings.Contains(ln, "closed->open (connection_error)") || strings.Contains(ln, "  open") {
			t.Fatalf("the fleet's breaker opened on one pod's egress: %q\n%s", ln, s)
		}
	}
	// After pod A's open, pod B still sends to openai_us, pod A to azure_eu.
	if !strings.Contains(s, "-                3 ok             3 ok") {
		t.Fatalf("after pod A's open, pod A should be served by azure_eu and pod B by openai_us:\n%s", s)
	}
}

// A redis-server whose port was taken between the pick and its bind exits
// at once: startRedis says so (the fleet's Redis is tried on another
// port), rather than pinging a dead process for 10 s and failing the
// scenario, as the Redis tests' launcher did in a loaded CI run (#54).
func TestFleetRedisMovesOffATakenPort(t *testing.T) {
	bin := redistest.Need(t, "redis-server")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, _, exited, err := startRedis(bin, t.TempDir(), ln.Addr().(*net.TCPAddr).Port)
	if !exited || err == nil {
		t.Fatalf("a taken port: exited %v, %v", exited, err)
	}
	url, stop, err := fleetRedis("", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if !strings.HasPrefix(url, "redis://127.0.0.1:") {
		t.Fatalf("url %q", url)
	}
}
