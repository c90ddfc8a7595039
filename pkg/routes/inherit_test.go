package routes

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// R-P3: template → gateway → model → route; each level overrides the fields
// it sets.
func TestInheritance(t *testing.T) {
	doc := `
policies:
  base: {enabled: true, failure_threshold: 10, window_sec: 120, cooldown_ms: 60000}
  strict: {failure_threshold: 2, cooldown_ms: 1000}
gateways:
  - id: g
    circuit_breaker: {policy: base, window_sec: 90}
    models:
      - name: m
        routes: ["p:r:a", "p:r:b", "p:r:c"]
        circuit_breaker: {failure_threshold: 7, mode: shadow}
      - name: n
        routes: ["p:r:d", "p:r:e"]
        circuit_breaker: {policy: strict}
    routes:
      - {key: "p:r:a", cluster: a}
      - {key: "p:r:b", cluster: b, circuit_breaker: {failure_threshold: 3}}
      - {key: "p:r:c", cluster: c, circuit_breaker: {policy: strict, window_sec: 5}}
      - {key: "p:r:d", cluster: d}
      - {key: "p:r:e", cluster: e, circuit_breaker: {enabled: false}}
`
	rt := mustParse(t, doc)
	g := rt.Gateways["g"]
	type want struct {
		enabled           bool
		threshold, window int
		cooldown          int64
		mode              breaker.Mode
	}
	cases := []struct {
		name string
		p    *breaker.Policy
		w    want
	}{
		{"gateway: template then own field", g.Policy, want{true, 10, 90, 60000, breaker.ModeProd}},
		{"model overrides gateway", g.Models["m"].Policy, want{true, 7, 90, 60000, breaker.ModeShadow}},
		{"route inherits model", g.Routes["p:r:a"].Policy, want{true, 7, 90, 60000, breaker.ModeShadow}},
		{"route overrides model", g.Routes["p:r:b"].Policy, want{true, 3, 90, 60000, breaker.ModeShadow}},
		{"route template then own field", g.Routes["p:r:c"].Policy, want{true, 2, 5, 1000, breaker.ModeShadow}},
		{"model template over gateway", g.Routes["p:r:d"].Policy, want{true, 2, 90, 1000, breaker.ModeProd}},
		{"route disables", g.Routes["p:r:e"].Policy, want{false, 2, 90, 1000, breaker.ModeProd}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := want{tc.p.Enabled, tc.p.FailureThreshold, tc.p.WindowSec, tc.p.CooldownMs, tc.p.Mode}
			if got != tc.w {
				t.Fatalf("got %+v, want %+v", got, tc.w)
			}
			if len(tc.p.Version) != 8 {
				t.Fatalf("policy_version %q", tc.p.Version)
			}
		})
	}
	// Untouched fields keep SPEC defaults.
	p := g.Routes["p:r:a"].Policy
	if p.HalfOpenMaxProbes != 1 || p.RetryAfter != "block" || p.ProbeTimeoutMs != 120000 || p.WhenAllOpen != "try_all" {
		t.Fatalf("defaults lost: %+v", p)
	}
	// Same resolved policy → same version; different → different.
	if g.Routes["p:r:a"].Policy.Version != g.Models["m"].Policy.Version {
		t.Error("identical policies must share a version")
	}
	if g.Routes["p:r:a"].Policy.Version == g.Routes["p:r:b"].Policy.Version {
		t.Error("different policies must differ in version")
	}
}

// R-P4: the version is the first 8 hex chars of SHA-256 of the canonical JSON,
// stable across loads.
func TestPolicyVersionStable(t *testing.T) {
	a := mustParse(t, baseYAML).Gateways["default"].Policy.Version
	b := mustParse(t, baseYAML).Gateways["default"].Policy.Version
	if a != b {
		t.Fatalf("version not stable: %s vs %s", a, b)
	}
	d := breaker.DefaultPolicy()
	d.Finish()
	if d.Version == a {
		t.Fatal("version ignores fields")
	}
}

// R-P2: a malformed status list in stored config falls back to the default
// instead of failing; the fallback is reported with its policy version.
func TestLenientFallback(t *testing.T) {
	doc := cfg(`{enabled: true, failure_status_codes: "500,502"}`, "", `{open_on_status_codes: {a: 1}}`)
	if _, err := Parse([]byte(doc), Options{}); err == nil {
		t.Fatal("strict load must refuse")
	}
	rt, err := Parse([]byte(doc), Options{Lenient: true})
	if err != nil {
		t.Fatalf("lenient: %v", err)
	}
	g := rt.Gateways["gw1"]
	if fmt.Sprint(g.Policy.FailureStatusCodes) != "[500 502 503 504]" {
		t.Fatalf("want default codes, got %v", g.Policy.FailureStatusCodes)
	}
	r := g.Routes["openai:us-east:m1"]
	if len(r.Policy.OpenOnStatusCodes) != 0 {
		t.Fatalf("open codes %v", r.Policy.OpenOnStatusCodes)
	}
	if len(rt.Fallbacks) < 2 {
		t.Fatalf("fallbacks %+v", rt.Fallbacks)
	}
	fields := ""
	for _, f := range rt.Fallbacks {
		fields += f.Field + " "
		if f.PolicyVersion == "" {
			t.Error("fallback without policy version")
		}
	}
	if !strings.Contains(fields, "failure_status_codes") || !strings.Contains(fields, "open_on_status_codes") {
		t.Fatalf("fallback fields %q", fields)
	}
	// Other errors still fail a lenient load.
	if _, err := Parse([]byte(cfg(`{failure_threshold: 0}`, "", "")), Options{Lenient: true}); err == nil {
		t.Fatal("lenient load must still refuse other errors")
	}
}

func TestCandidateOrdering(t *testing.T) {
	doc := `
gateways:
  - id: g
    models:
      - name: listed
        routes: ["p:1:m", "p:2:m", "p:3:m", "p:4:m"]
      - name: cheap
        order: cheapest
        routes: ["p:1:m", "p:2:m", "p:3:m", "p:4:m"]
    routes:
      - {key: "p:1:m", cluster: c1, cost_per_mtok: 2.0, residency: [us]}
      - {key: "p:2:m", cluster: c2, cost_per_mtok: 1.0, residency: [eu]}
      - {key: "p:3:m", cluster: c3, cost_per_mtok: 4.0, bias: 0.5, residency: [us, hipaa]}
      - {key: "p:4:m", cluster: c4, cost_per_mtok: 1.0, residency: [us]}
`
	rt := mustParse(t, doc)
	g := rt.Gateways["g"]
	keys := func(rs []*Route) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.Key)
		}
		return strings.Join(s, ",")
	}
	cases := []struct {
		model     string
		residency string
		want      string
	}{
		{"listed", "", "p:1:m,p:2:m,p:3:m,p:4:m"},
		// 2.0, 1.0, 4.0×0.5=2.0, 1.0: ties keep listed order.
		{"cheap", "", "p:2:m,p:4:m,p:1:m,p:3:m"},
		{"cheap", "us", "p:4:m,p:1:m,p:3:m"},
		{"listed", "us, hipaa", "p:3:m"},
		{"listed", "eu", "p:2:m"},
		{"listed", "cn", ""},
		{"listed", " , ", "p:1:m,p:2:m,p:3:m,p:4:m"},
	}
	for _, tc := range cases {
		t.Run(tc.model+"/"+tc.residency, func(t *testing.T) {
			got := keys(g.Models[tc.model].Candidates(ParseResidency(tc.residency)))
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRouteKeyProvider(t *testing.T) {
	for key, want := range map[string]string{
		"openai:us-east:gpt-4o-mini":                         "openai",
		"bedrock:us-east-1:anthropic.claude-3-5-sonnet-v1:0": "bedrock",
		"self:gpu-a:meta-llama/Llama-3-70B":                  "self",
	} {
		if got := ProviderOf(key); got != want {
			t.Errorf("ProviderOf(%q) = %q", key, got)
		}
	}
}

func TestCandidatesNoAllocWithoutResidency(t *testing.T) {
	m := mustParse(t, baseYAML).Gateways["default"].Models["gpt-4o-mini"]
	if n := testing.AllocsPerRun(100, func() { _ = m.Candidates(nil) }); n != 0 {
		t.Fatalf("allocs %v", n)
	}
}

// The documented example config is valid and means what its comments say.
func TestExampleConfig(t *testing.T) {
	rt, err := LoadFile("../../deploy/fusebox.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := rt.Gateways["default"]
	if got := g.Models["gpt-4o-mini"].Candidates(nil); got[0].Key != "openai:us-east:gpt-4o-mini" || got[1].Key != "azure:eu-west:gpt-4o-mini" {
		t.Fatalf("cheapest order %v %v", got[0].Key, got[1].Key)
	}
	p := g.Routes["self:gpu-east-a:meta-llama/Llama-3.1-70B-Instruct"].Policy
	if p.Window != "sliding" || p.HalfOpenMaxProbes != 2 || p.MaxEjectionPercent != 50 || !p.IsOpenStatus(401) {
		t.Fatalf("inherited policy %+v", p)
	}
	if r := g.Routes["bedrock:us-east-1:anthropic.claude-sonnet-4-5-v1:0"]; r.Provider != "bedrock" {
		t.Fatal(r.Provider)
	}
}

// The config docker-compose.yaml gives both fusebox replicas is valid and
// runs them on Redis.
func TestComposeConfig(t *testing.T) {
	rt, err := LoadFile("../../deploy/compose/fusebox-redis.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if rt.Store.Backend != StoreRedis || rt.Store.Redis.URL != "redis://redis:6379/0" {
		t.Fatalf("store: %+v", rt.Store)
	}
	if _, ok := rt.Gateways["default"]; !ok {
		t.Fatal("no default gateway")
	}
}
