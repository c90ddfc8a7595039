package admin

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

const apiCfg = `
fleets:
  - name: gpu
    circuit_breaker: {enabled: true, failure_threshold: 1}
gateways:
  - id: g
    circuit_breaker: {enabled: true, failure_threshold: 1, cooldown_ms: 10000}
    models:
      - {name: m, routes: ["a:r:m", "self:r:meta-llama/Llama-3-70B"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "self:r:meta-llama/Llama-3-70B", cluster: cs, fleet: gpu}
  - id: offgw
    circuit_breaker: {enabled: false}
    models:
      - {name: m, routes: ["a:r:m", "b:r:m"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "b:r:m", cluster: cb}
`

type apiEnv struct {
	t     *testing.T
	srv   *httptest.Server
	store *breaker.Memory
	clk   *breaker.FakeClock
	rt    *routes.Runtime
}

func newAPIEnv(t *testing.T, token string) *apiEnv {
	rt, err := routes.Parse([]byte(apiCfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &apiEnv{t: t, store: breaker.NewMemory(nil), clk: breaker.NewFakeClock(time.Unix(1_800_000_000, 0)), rt: rt}
	if _, _, err := e.store.Install(context.Background(), e.clk.Now().UnixNano(), rt.BreakerSpecs()); err != nil {
		t.Fatal(err)
	}
	s := NewServer(NewHealth(), metrics.New().Registry, Auth{Token: token, Loopback: true})
	(&API{Config: routes.NewHolder(rt), Store: e.store, Clock: e.clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}).Register(s)
	e.srv = httptest.NewServer(s)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *apiEnv) do(method, path, body string) (int, map[string]any) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, &v); err != nil {
			e.t.Fatalf("bad JSON %q", raw)
		}
	}
	return resp.StatusCode, v
}

func TestAPIOverrides(t *testing.T) {
	e := newAPIEnv(t, "")
	llama := url.PathEscape("self:r:meta-llama/Llama-3-70B")
	cases := []struct {
		name, method, path, body string
		code                     int
		check                    func(t *testing.T, v map[string]any)
	}{
		{"empty status", "GET", "/admin/v1/gateways/g/circuit-breaker", "", 200, func(t *testing.T, v map[string]any) {
			if len(v) != 0 {
				t.Fatalf("closed routes must be absent: %v", v)
			}
		}},
		{"force-open with duration", "POST", "/admin/v1/gateways/g/routes/a:r:m/force-open", `{"duration_sec": 60}`, 200, nil},
		{"status shows it", "GET", "/admin/v1/gateways/g/circuit-breaker", "", 200, func(t *testing.T, v map[string]any) {
			s := v["a:r:m"].(map[string]any)
			if s["state"] != "open" || s["forced"] != true || s["open_until"].(float64) != 1_800_000_060 || s["scope"] != "gateway" {
				t.Fatalf("%v", s)
			}
		}},
		{"escaped key with a slash", "POST", "/admin/v1/gateways/g/routes/" + llama + "/force-open", "", 200, nil},
		{"status of the escaped key", "GET", "/admin/v1/gateways/g/circuit-breaker", "", 200, func(t *testing.T, v map[string]any) {
			if s, ok := v["self:r:meta-llama/Llama-3-70B"].(map[string]any); !ok || s["open_until"] != nil {
				t.Fatalf("forced without duration: %v", v)
			}
		}},
		{"force-close", "POST", "/admin/v1/gateways/g/routes/a:r:m/force-close", "", 200, nil},
		{"reset", "POST", "/admin/v1/gateways/g/routes/" + llama + "/reset", "{}", 200, nil},
		{"all closed again", "GET", "/admin/v1/gateways/g/circuit-breaker", "", 200, func(t *testing.T, v map[string]any) {
			if len(v) != 0 {
				t.Fatalf("%v", v)
			}
		}},
		{"bad duration", "POST", "/admin/v1/gateways/g/routes/a:r:m/force-open", `{"duration_sec": 1.5}`, 400, nil},
		{"unknown field", "POST", "/admin/v1/gateways/g/routes/a:r:m/force-open", `{"duration": 5}`, 400, nil},
		{"string duration", "POST", "/admin/v1/gateways/g/routes/a:r:m/force-open", `{"duration_sec": "5"}`, 400, nil},
		{"unknown gateway", "POST", "/admin/v1/gateways/zz/routes/a:r:m/force-open", "", 404, nil},
		{"unknown route", "POST", "/admin/v1/gateways/g/routes/zz:r:m/reset", "", 404, nil},
		{"unknown action", "POST", "/admin/v1/gateways/g/routes/a:r:m/explode", "", 404, nil},
		{"mode off → 409", "POST", "/admin/v1/gateways/offgw/routes/a:r:m/force-open", "", 409, nil},
		{"fleet force-open", "POST", "/admin/v1/fleets/gpu/force-open", `{"duration_sec": 30}`, 200, nil},
		{"fleet status", "GET", "/admin/v1/fleets/gpu/circuit-breaker", "", 200, func(t *testing.T, v map[string]any) {
			if v["state"] != "open" || v["scope"] != "global" || v["forced"] != true {
				t.Fatalf("%v", v)
			}
		}},
		{"fleets list", "GET", "/admin/v1/fleets", "", 200, func(t *testing.T, v map[string]any) {
			if _, ok := v["gpu"]; !ok {
				t.Fatalf("%v", v)
			}
		}},
		{"gateway shows the fleet", "GET", "/admin/v1/gateways/g/circuit-breaker", "", 200, func(t *testing.T, v map[string]any) {
			if _, ok := v["fleet:gpu"]; !ok {
				t.Fatalf("%v", v)
			}
		}},
		{"unknown fleet", "GET", "/admin/v1/fleets/nope/circuit-breaker", "", 404, nil},
		{"routes view", "GET", "/admin/v1/gateways/g/routes", "", 200, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, v := e.do(tc.method, tc.path, tc.body)
			if code != tc.code {
				t.Fatalf("code %d want %d (%v)", code, tc.code, v)
			}
			if code >= 400 {
				if _, ok := v["error"].(string); !ok {
					t.Fatalf("error shape: %v", v)
				}
			}
			if tc.check != nil {
				tc.check(t, v)
			}
		})
	}
}

func TestAPIRequiresToken(t *testing.T) {
	e := newAPIEnv(t, "tok")
	if code, _ := e.do("POST", "/admin/v1/gateways/g/routes/a:r:m/force-open", ""); code != 401 {
		t.Fatalf("code %d", code)
	}
}

func FuzzParseForceOpen(f *testing.F) {
	for _, s := range []string{"", "{}", `{"duration_sec":5}`, `{"duration_sec":null}`, `{"duration_sec":5.0}`, `{"duration_sec":-1}`, `{"x":1}`, `[]`, `{"duration_sec":1e400}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseForceOpen(b)
		if err != nil {
			return
		}
		if d < 0 || d > maxForceSec*time.Second || d%time.Second != 0 {
			t.Fatalf("accepted %v from %q", d, b)
		}
	})
}
