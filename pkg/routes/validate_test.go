package routes

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// cfg builds a document with the given circuit_breaker bodies at the gateway,
// model and first route levels ("" leaves a level unset).
func cfg(gatewayCB, modelCB, routeCB string) string {
	line := func(indent, cb string) string {
		if cb == "" {
			return ""
		}
		return indent + "circuit_breaker: " + cb + "\n"
	}
	return `
policies:
  conservative: {failure_threshold: 10, window_sec: 120, cooldown_ms: 60000}
gateways:
  - id: gw1
` + line("    ", gatewayCB) + `    models:
      - name: m1
        routes: [openai:us-east:m1, azure:eu-west:m1]
` + line("        ", modelCB) + `    routes:
      - key: openai:us-east:m1
        cluster: c1
` + line("        ", routeCB) + `      - key: azure:eu-west:m1
        cluster: c2
`
}

func mustParse(t *testing.T, doc string) *Runtime {
	t.Helper()
	rt, err := Parse([]byte(doc), Options{})
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, doc)
	}
	return rt
}

func problems(t *testing.T, doc string) []string {
	t.Helper()
	_, err := Parse([]byte(doc), Options{})
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("want a ConfigError, got %v\n%s", err, doc)
	}
	return ce.Problems
}

func TestValidConfigs(t *testing.T) {
	cases := []struct {
		name string
		doc  string
	}{
		{"base", baseYAML},
		{"embedded default", string(defaultYAML)},
		{"codes null means unset", cfg("{failure_status_codes: null}", "", "")},
		{"codes {} means unset", cfg("{failure_status_codes: {}}", "", "")},
		{"codes empty array", cfg("{failure_status_codes: []}", "", "")},
		{"codes with .0 (R-P8)", cfg("{failure_status_codes: [500.0, 429]}", "", "")},
		{"open_on_status_codes", cfg("{open_on_status_codes: [401]}", "", "")},
		{"json flow style", cfg(`{"enabled": true, "failure_threshold": 5.0}`, "", "")},
		{"all extension fields", cfg(`{enabled: true, mode: shadow, window: sliding, consecutive_failures: 3,
          failure_rate_percent: 50.5, rate_window_sec: 10, minimum_requests: 3, slow_call_ms: 2000,
          slow_call_rate_percent: 80, half_open_max_probes: 0, probe_timeout_ms: 1000, backoff_multiplier: 2,
          max_cooldown_ms: 600000, retry_after: ignore, max_retry_after_sec: 60, max_ejection_percent: 50,
          when_all_open: fail_fast}`, "", "")},
		{"max_cooldown below cooldown is fine without backoff", cfg("{cooldown_ms: 5000, max_cooldown_ms: 1000}", "", "")},
		{"route key with colons and slashes", strings.ReplaceAll(cfg("", "", ""), "openai:us-east:m1", "bedrock:us-east-1:meta-llama/llama-3-70b-v1:0")},
		{"anthropic routes", strings.ReplaceAll(cfg("", "", ""), "cluster: c", "api: anthropic\n        cluster: c")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { mustParse(t, tc.doc) })
	}
}

func TestInvalidConfigs(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // substrings, each in some problem
	}{
		// #37: names an HTTP path cannot address as one segment.
		{"model named ..", strings.Replace(cfg("", "", ""), "name: m1", `name: ".."`, 1), []string{`model "..": name: ".." is not a name`}},
		{"model named .", strings.Replace(cfg("", "", ""), "name: m1", `name: "."`, 1), []string{`model ".": name`}},
		{"model name with a slash", strings.Replace(cfg("", "", ""), "name: m1", `name: "a/b"`, 1), []string{`model "a/b": name: "a/b" must not contain '/'`}},
		{"model name with a control character", strings.Replace(cfg("", "", ""), "name: m1", `name: "a\tb"`, 1), []string{`must not contain '/' or control characters`}},
		// R-P1: every bad form of a status list.
		{"codes string", cfg(`{failure_status_codes: "500"}`, "", ""), []string{`gateway "gw1": circuit_breaker.failure_status_codes: must be an array`, "got a string"}},
		{"codes number", cfg(`{failure_status_codes: 500}`, "", ""), []string{"circuit_breaker.failure_status_codes", "got a number"}},
		{"codes object", cfg(`{failure_status_codes: {a: 1}}`, "", ""), []string{"circuit_breaker.failure_status_codes", "non-empty object"}},
		{"codes string element", cfg(`{failure_status_codes: [500, "502"]}`, "", ""), []string{"failure_status_codes: element 1"}},
		{"codes fractional element", cfg(`{failure_status_codes: [500.5]}`, "", ""), []string{"failure_status_codes: element 0", "whole number"}},
		{"codes nested array", cfg(`{failure_status_codes: [[500]]}`, "", ""), []string{"failure_status_codes: element 0", "an array"}},
		{"codes null element", cfg(`{failure_status_codes: [null]}`, "", ""), []string{"failure_status_codes: element 0"}},
		{"codes bool element", cfg(`{failure_status_codes: [true]}`, "", ""), []string{"failure_status_codes: element 0"}},
		{"codes out of range", cfg(`{failure_status_codes: [99]}`, "", ""), []string{"not an HTTP status"}},
		{"codes out of range high", cfg(`{failure_status_codes: [600]}`, "", ""), []string{"not an HTTP status"}},
		{"codes bool", cfg(`{failure_status_codes: true}`, "", ""), []string{"failure_status_codes", "got a boolean"}},
		{"open codes string at model", cfg("", `{open_on_status_codes: "401"}`, ""), []string{`model "m1": circuit_breaker.open_on_status_codes`}},
		{"codes bad at route", cfg("", "", `{failure_status_codes: ["x"]}`), []string{`route "openai:us-east:m1": circuit_breaker.failure_status_codes`}},
		// Every other field is range-checked.
		{"threshold zero", cfg(`{failure_threshold: 0}`, "", ""), []string{"circuit_breaker.failure_threshold: must be a whole number in 1..1000000, got 0"}},
		// R-P1 upper bounds: no config can exhaust memory or overflow a time.
		{"window_sec huge", cfg(`{window_sec: 1000000000}`, "", ""), []string{"circuit_breaker.window_sec: must be a whole number in 1..86400, got 1000000000"}},
		{"cooldown huge", cfg(`{cooldown_ms: 1e13}`, "", ""), []string{"circuit_breaker.cooldown_ms: must be a whole number in 1..86400000"}},
		{"max cooldown huge", cfg(`{max_cooldown_ms: 86400001}`, "", ""), []string{"circuit_breaker.max_cooldown_ms"}},
		{"rate window huge", cfg(`{rate_window_sec: 3601}`, "", ""), []string{"circuit_breaker.rate_window_sec"}},
		{"probe timeout huge", cfg(`{probe_timeout_ms: 3600001}`, "", ""), []string{"circuit_breaker.probe_timeout_ms"}},
		{"slow call huge", cfg(`{slow_call_ms: 3600001}`, "", ""), []string{"circuit_breaker.slow_call_ms"}},
		{"threshold huge", cfg(`{failure_threshold: 1000001}`, "", ""), []string{"circuit_breaker.failure_threshold"}},
		{"consecutive huge", cfg(`{consecutive_failures: 1000001}`, "", ""), []string{"circuit_breaker.consecutive_failures"}},
		{"minimum huge", cfg(`{minimum_requests: 1000001}`, "", ""), []string{"circuit_breaker.minimum_requests"}},
		{"probes huge", cfg(`{half_open_max_probes: 10001}`, "", ""), []string{"circuit_breaker.half_open_max_probes"}},
		{"multiplier huge", cfg(`{backoff_multiplier: 101}`, "", ""), []string{"circuit_breaker.backoff_multiplier: must be a number in 1..100"}},
		{"max retry after huge", cfg(`{max_retry_after_sec: 86401}`, "", ""), []string{"circuit_breaker.max_retry_after_sec"}},
		{"stall huge", cfg(`{stall_ms: 3600001}`, "", ""), []string{"circuit_breaker.stall_ms: must be a whole number in 0..3600000"}},
		{"stall negative", cfg(`{stall_ms: -1}`, "", ""), []string{"circuit_breaker.stall_ms"}},
		{"baseline multiplier negative", cfg(`{slow_call_baseline_multiplier: -1}`, "", ""), []string{"circuit_breaker.slow_call_baseline_multiplier: must be a number in 0..100"}},
		{"baseline multiplier huge", cfg(`{slow_call_baseline_multiplier: 1000}`, "", ""), []string{"circuit_breaker.slow_call_baseline_multiplier"}},
		{"baseline multiplier string", cfg(`{slow_call_baseline_multiplier: "3"}`, "", ""), []string{"circuit_breaker.slow_call_baseline_multiplier"}},
		{"failover zero", strings.Replace(cfg("", "", ""), "    models:", "    failover: {max_attempts: 0}\n    models:", 1), []string{"failover.max_attempts: must be a whole number in 1..10, got 0"}},
		{"failover too many", strings.Replace(cfg("", "", ""), "- name: m1", "- name: m1\n        failover: {max_attempts: 11}", 1), []string{`model "m1": failover.max_attempts: must be a whole number in 1..10, got 11`}},
		{"failover string", strings.Replace(cfg("", "", ""), "    models:", "    failover: {max_attempts: \"3\"}\n    models:", 1), []string{"failover.max_attempts: must be a whole number"}},
		{"codes duplicate", cfg(`{failure_status_codes: [500, 500]}`, "", ""), []string{"circuit_breaker.failure_status_codes: element 1: 500 is listed twice"}},
		{"codes duplicate written differently", cfg(`{failure_status_codes: [503, 503.0]}`, "", ""), []string{"503 is listed twice"}},
		{"codes success", cfg(`{failure_status_codes: [200]}`, "", ""), []string{"circuit_breaker.failure_status_codes: element 0: 200 is below 400"}},
		{"open codes redirect", cfg(`{open_on_status_codes: [302]}`, "", ""), []string{"circuit_breaker.open_on_status_codes: element 0: 302 is below 400"}},
		{"threshold fraction", cfg(`{failure_threshold: 2.5}`, "", ""), []string{"circuit_breaker.failure_threshold: must be a whole number"}},
		{"threshold string", cfg(`{failure_threshold: "5"}`, "", ""), []string{"circuit_breaker.failure_threshold", "a string"}},
		{"window_sec zero", cfg(`{window_sec: 0}`, "", ""), []string{"circuit_breaker.window_sec"}},
		{"cooldown negative", cfg(`{cooldown_ms: -1}`, "", ""), []string{"circuit_breaker.cooldown_ms"}},
		{"enabled string", cfg(`{enabled: "yes"}`, "", ""), []string{"circuit_breaker.enabled: must be true or false"}},
		{"mode bad", cfg(`{mode: loud}`, "", ""), []string{"circuit_breaker.mode", `"loud"`}},
		{"window bad", cfg(`{window: hopping}`, "", ""), []string{"circuit_breaker.window"}},
		{"rate > 100", cfg(`{failure_rate_percent: 101}`, "", ""), []string{"circuit_breaker.failure_rate_percent: must be a number in 0..100"}},
		{"slow rate < 0", cfg(`{slow_call_rate_percent: -1}`, "", ""), []string{"circuit_breaker.slow_call_rate_percent"}},
		{"consecutive negative", cfg(`{consecutive_failures: -1}`, "", ""), []string{"circuit_breaker.consecutive_failures"}},
		{"rate window zero", cfg(`{rate_window_sec: 0}`, "", ""), []string{"circuit_breaker.rate_window_sec"}},
		{"minimum zero", cfg(`{minimum_requests: 0}`, "", ""), []string{"circuit_breaker.minimum_requests"}},
		{"slow negative", cfg(`{slow_call_ms: -5}`, "", ""), []string{"circuit_breaker.slow_call_ms"}},
		{"probes negative", cfg(`{half_open_max_probes: -1}`, "", ""), []string{"circuit_breaker.half_open_max_probes"}},
		{"probe timeout zero", cfg(`{probe_timeout_ms: 0}`, "", ""), []string{"circuit_breaker.probe_timeout_ms"}},
		{"multiplier below 1", cfg(`{backoff_multiplier: 0.5}`, "", ""), []string{"circuit_breaker.backoff_multiplier"}},
		{"max cooldown zero", cfg(`{max_cooldown_ms: 0}`, "", ""), []string{"circuit_breaker.max_cooldown_ms"}},
		{"max cooldown below cooldown with backoff", cfg(`{backoff_multiplier: 2, cooldown_ms: 5000, max_cooldown_ms: 1000}`, "", ""), []string{"circuit_breaker.max_cooldown_ms: 1000 is below cooldown_ms 5000"}},
		{"retry_after bad", cfg(`{retry_after: honour}`, "", ""), []string{"circuit_breaker.retry_after"}},
		{"max retry after zero", cfg(`{max_retry_after_sec: 0}`, "", ""), []string{"circuit_breaker.max_retry_after_sec"}},
		{"ejection > 100", cfg(`{max_ejection_percent: 101}`, "", ""), []string{"circuit_breaker.max_ejection_percent"}},
		{"quorum 0", cfg(`{local_origin_quorum: 0}`, "", ""), []string{"circuit_breaker.local_origin_quorum"}},
		{"quorum not whole", cfg(`{local_origin_quorum: 1.5}`, "", ""), []string{"circuit_breaker.local_origin_quorum"}},
		{"request fault ttl over a day", cfg(`{request_fault_ttl_sec: 86401}`, "", ""), []string{"circuit_breaker.request_fault_ttl_sec"}},
		{"request fault ttl negative", cfg(`{request_fault_ttl_sec: -1}`, "", ""), []string{"circuit_breaker.request_fault_ttl_sec"}},
		{"when_all_open bad", cfg(`{when_all_open: panic}`, "", ""), []string{"circuit_breaker.when_all_open"}},
		{"unknown policy field", cfg(`{failure_treshold: 3}`, "", ""), []string{"circuit_breaker.failure_treshold: unknown field"}},
		{"circuit_breaker not an object", cfg(`[1]`, "", ""), []string{"must be an object"}},
		// R-P6
		{"unknown template", cfg(`{policy: aggressive}`, "", ""), []string{`gateway "gw1": circuit_breaker.policy: unknown policy template "aggressive"`}},
		{"unknown template at route", cfg("", "", `{policy: nope}`), []string{`route "openai:us-east:m1": circuit_breaker.policy: unknown policy template "nope"`}},
		// R-P7
		{"mixed api", strings.Replace(cfg("", "", ""), "cluster: c2", "cluster: c2\n        api: anthropic", 1), []string{`model "m1": routes: all routes of a model must speak the same api`}},
		// Strict decoding of the rest of the document.
		{"tracing protocol", "tracing: {protocol: http/json}\n" + cfg("", "", ""), []string{`tracing.protocol: must be one of grpc, http/protobuf, got "http/json"`}},
		{"tracing endpoint", "tracing: {endpoint: collector:4317}\n" + cfg("", "", ""), []string{`tracing.endpoint: must be an http:// or https:// URL with a host (the OTLP collector), got "collector:4317"`}},
		{"unknown top-level field", "listn: {}\n" + cfg("", "", ""), []string{`line 1: unknown field "listn" in the top level (known: access_log, admin, decision_wait_sec, envoy, fleets, gateways, headers, limits, listen, policies, store, tracing; did you mean "listen"?)`}},
		{"unknown route field", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        clustr: x", 1), []string{`unknown field "clustr" in a route (known: api, bias,`}},
		{"no gateways", "gateways: []\n", []string{"at least one gateway"}},
		{"duplicate gateway", cfg("", "", "") + "  - id: gw1\n    models: [{name: x, routes: [a:b]}]\n    routes: [{key: a:b, cluster: c}]\n", []string{`gateway "gw1": id: defined twice`}},
		{"duplicate route", strings.Replace(cfg("", "", ""), "azure:eu-west:m1\n        cluster", "openai:us-east:m1\n        cluster", 1), []string{"key: defined twice"}},
		{"unknown route in model", strings.Replace(cfg("", "", ""), "routes: [openai:us-east:m1,", "routes: [openai:us-east:m9,", 1), []string{`"openai:us-east:m9" is not a route of this gateway`}},
		{"route key without provider", strings.ReplaceAll(cfg("", "", ""), "openai:us-east:m1", "':x'"), []string{"must be provider:region:model"}},
		{"route key without colon", strings.ReplaceAll(cfg("", "", ""), "openai:us-east:m1", "openai"), []string{"must be provider:region:model"}},
		{"route key with comma", strings.ReplaceAll(cfg("", "", ""), "openai:us-east:m1", "openai:us,east"), []string{"commas"}},
		{"empty cluster", strings.Replace(cfg("", "", ""), "cluster: c1", `cluster: ""`, 1), []string{"cluster: must not be empty"}},
		{"bad cluster", strings.Replace(cfg("", "", ""), "cluster: c1", `cluster: "c 1"`, 1), []string{"cluster:"}},
		{"negative cost", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        cost_per_mtok: -1", 1), []string{"cost_per_mtok"}},
		{"zero bias", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        bias: 0", 1), []string{"bias: must be a finite number >0"}},
		// R-L8: names and values that would be written into Envoy's headers.
		{"nan bias", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        bias: .nan", 1), []string{"bias: must be a finite number >0, got NaN"}},
		{"inf cost", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        cost_per_mtok: .inf", 1), []string{"cost_per_mtok: must be a finite number"}},
		{"path with CRLF", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        path: \"/v1/x\\r\\nx-evil: 1\"", 1), []string{"path: must be printable ASCII"}},
		{"path with space", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        path: \"/v1/a b\"", 1), []string{"path: must be printable ASCII"}},
		{"cluster header is host", "headers: {cluster: host}\n" + cfg("", "", ""), []string{`headers.cluster: "host" is reserved`}},
		{"route header is content-length", "headers: {route: content-length}\n" + cfg("", "", ""), []string{`headers.route: "content-length" is reserved`}},
		{"header is x-envoy", "headers: {model: x-envoy-original-path}\n" + cfg("", "", ""), []string{`headers.model: "x-envoy-original-path" is reserved`}},
		{"header is pseudo", "headers: {cluster: \":path\"}\n" + cfg("", "", ""), []string{`headers.cluster: ":path" is not a lower-case HTTP header name`}},
		// R-L1, R-L6, R-L5.
		{"message limit below the buffer", "limits: {max_message_bytes: 4194304}\n" + cfg("", "", ""), []string{"limits.max_message_bytes: must be in"}},
		{"streams zero", "limits: {max_concurrent_streams: 0}\n" + cfg("", "", ""), []string{"limits.max_concurrent_streams"}},
		{"tls cert without key", "listen: {tls: {cert_file: a.pem}}\n" + cfg("", "", ""), []string{"listen.tls: cert_file and key_file go together"}},
		{"client ca without cert", "listen: {tls: {client_ca_file: ca.pem}}\n" + cfg("", "", ""), []string{"listen.tls.client_ca_file"}},
		{"bad api", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        api: gemini", 1), []string{"api: must be openai or anthropic"}},
		{"bad path", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        path: v1/x", 1), []string{"path: must start with '/'"}},
		{"unknown fleet", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        fleet: ghost", 1), []string{`fleet: unknown fleet "ghost"`}},
		{"bad order", strings.Replace(cfg("", "", ""), "- name: m1", "- name: m1\n        order: random", 1), []string{"order: must be listed or cheapest"}},
		{"bad residency tag", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        residency: [\"us,eu\"]", 1), []string{"residency[0]"}},
		{"bad listen", "listen: {grpc: nonsense}\n" + cfg("", "", ""), []string{"listen.grpc"}},
		{"relative unix socket", "listen: {grpc: 'unix://run/x.sock'}\n" + cfg("", "", ""), []string{"listen.grpc: \"unix://run/x.sock\": a Unix socket is unix:///absolute/path"}},
		{"unix socket path too long", "listen: {grpc: 'unix:///" + strings.Repeat("a", 107) + "'}\n" + cfg("", "", ""), []string{"at most 107 bytes"}},
		{"unix admin listener", "listen: {admin: 'unix:///run/a.sock'}\n" + cfg("", "", ""), []string{"listen.admin"}},
		{"bad socket mode", "listen: {grpc: 'unix:///run/x.sock', grpc_socket: {mode: '1777'}}\n" + cfg("", "", ""), []string{"listen.grpc_socket.mode"}},
		{"bad store", "store: {backend: etcd}\n" + cfg("", "", ""), []string{"store.backend"}},
		{"bad redis url", "store: {redis: {url: 'http://x'}}\n" + cfg("", "", ""), []string{"store.redis.url"}},
		{"bad header", "headers: {cluster: X-Cluster}\n" + cfg("", "", ""), []string{"headers.cluster"}},
		{"duplicate header", "headers: {route: x-fusebox-cluster}\n" + cfg("", "", ""), []string{"headers.route"}},
		{"template names a template", strings.Replace(cfg("", "", ""), "conservative: {", "conservative: {policy: x, ", 1), []string{"a template cannot name another template"}},
		{"bad template field", strings.Replace(cfg("", "", ""), "conservative: {", "conservative: {failure_status_codes: 5, ", 1), []string{"policies.conservative: circuit_breaker.failure_status_codes"}},
		{"duplicate fleet", "fleets: [{name: f}, {name: f}]\n" + cfg("", "", ""), []string{`fleet "f": name: defined twice`}},
		{"shared route with diverging policies", `
gateways:
  - id: g
    models:
      - {name: a, routes: ["p:r:x", "p:r:y"], circuit_breaker: {failure_threshold: 2}}
      - {name: b, routes: ["p:r:x", "p:r:y"], circuit_breaker: {failure_threshold: 3}}
    routes: [{key: "p:r:x", cluster: x}, {key: "p:r:y", cluster: y}]
`, []string{"must agree"}},
		{"syntax error", "gateways: [", []string{"yaml"}},
		// The decoder's errors name the line the operator wrote and the
		// field, never a Go type.
		{"unclosed flow sequence", "gateways:\n  - id: g\n    models:\n      - name: m\n        routes: [a:b:c\n    routes: []\n", []string{"yaml: line 5: did not find expected ',' or ']'"}},
		{"unclosed flow map", "listen:\n  x: 1\nstore: {backend: memory\n", []string{"yaml: line 3: did not find expected ',' or '}'"}},
		{"wrong type names field", strings.Replace(cfg("", "", ""), "cluster: c1", "cluster: c1\n        cost_per_mtok: cheap", 1), []string{`gateways[0].routes[0].cost_per_mtok: must be a number, got a string "cheap"`}},
		{"list expected", strings.Replace(cfg("", "", ""), "routes: [openai:us-east:m1, azure:eu-west:m1]", "routes: openai:us-east:m1", 1), []string{`line 8: gateways[0].models[0].routes: must be a list, got a string`}},
		{"empty", "", []string{"empty"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := problems(t, tc.doc)
			all := strings.Join(ps, "\n")
			if strings.Contains(all, "routes.") || strings.Contains(all, "float64") || strings.Contains(all, "[]string") {
				t.Errorf("a problem names a Go type:\n%s", all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("no problem contains %q; got:\n%s", w, all)
				}
			}
		})
	}
}

// A broken file reports every problem, not the first.
func TestEveryProblemReported(t *testing.T) {
	doc := cfg(`{failure_threshold: 0, failure_status_codes: "x", mode: loud}`, `{window_sec: -1}`, `{policy: nope}`)
	doc = "listn: 1\n" + doc
	ps := problems(t, doc)
	for _, w := range []string{"failure_threshold", "failure_status_codes", "mode", "window_sec", "unknown policy template", "listn"} {
		if !strings.Contains(strings.Join(ps, "\n"), w) {
			t.Errorf("missing %q in %v", w, ps)
		}
	}
	if len(ps) < 6 {
		t.Errorf("want ≥6 problems, got %d: %v", len(ps), ps)
	}
	for _, p := range ps {
		if strings.Count(strings.Join(ps, "\n"), p) > 1 {
			t.Errorf("problem reported twice: %q", p)
		}
	}
}

func TestSingleRouteWarning(t *testing.T) {
	doc := strings.Replace(cfg("", "", ""), "routes: [openai:us-east:m1, azure:eu-west:m1]", "routes: [openai:us-east:m1]", 1)
	rt := mustParse(t, doc)
	found := false
	for _, w := range rt.Warnings {
		if strings.Contains(w, `model "m1" is served by a single route`) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no R-P5 warning in %v", rt.Warnings)
	}
}

func TestStatusCodesNormalised(t *testing.T) {
	rt := mustParse(t, cfg("{failure_status_codes: [503, 500.0]}", "", ""))
	p := rt.Gateways["gw1"].Routes["openai:us-east:m1"].Policy
	if fmt.Sprint(p.FailureStatusCodes) != "[500 503]" {
		t.Fatalf("codes = %v", p.FailureStatusCodes)
	}
	if !p.IsFailureStatus(503) || p.IsFailureStatus(502) {
		t.Fatal("lookup set wrong")
	}
	for _, doc := range []string{cfg("{failure_status_codes: null}", "", ""), cfg("{failure_status_codes: {}}", "", "")} {
		p := mustParse(t, doc).Gateways["gw1"].Policy
		if fmt.Sprint(p.FailureStatusCodes) != "[500 502 503 504]" {
			t.Fatalf("unset list should default, got %v", p.FailureStatusCodes)
		}
	}
	p = mustParse(t, cfg("{failure_status_codes: []}", "", "")).Gateways["gw1"].Policy
	if len(p.FailureStatusCodes) != 0 || p.IsFailureStatus(500) {
		t.Fatalf("[] must mean no status counts, got %v", p.FailureStatusCodes)
	}
}
