package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

const gwFile = `
policies:
  base: {enabled: true, failure_threshold: 5, cooldown_ms: 30000}
gateways:
  - id: default
    circuit_breaker: {policy: base}
    models:
      - {name: gpt, routes: ["openai:us:gpt", "azure:eu:gpt"]}
    routes:
      - {key: "openai:us:gpt", cluster: c1}
      - {key: "azure:eu:gpt", cluster: c2}
  - id: other
    circuit_breaker: {enabled: true}
    models:
      - {name: m, routes: ["a:r:m", "b:r:m"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "b:r:m", cluster: cb}
`

type cfgEnv struct {
	t       *testing.T
	srv     *httptest.Server
	mgr     *routes.Manager
	holder  *routes.Holder
	persist string
	logs    *bytes.Buffer
	mu      sync.Mutex
}

func newCfgEnv(t *testing.T, token string, persist string) *cfgEnv {
	t.Helper()
	if persist == "" {
		persist = filepath.Join(t.TempDir(), "overlays.json")
	}
	e := &cfgEnv{t: t, persist: persist, logs: &bytes.Buffer{}}
	log := slog.New(slog.NewTextHandler(lockedWriter{e}, nil))
	e.mgr = &routes.Manager{Store: &routes.FileOverlays{Path: persist}, Log: log}
	rt, err := e.mgr.Open(context.Background(), []byte(gwFile))
	if err != nil {
		t.Fatal(err)
	}
	e.holder = routes.NewHolder(rt)
	e.mgr.Holder = e.holder
	s := NewServer(NewHealth(), metrics.New().Registry, Auth{Token: token, Loopback: true, Log: log})
	api := &API{Config: e.holder, Log: log}
	(&Gateways{Manager: e.mgr, API: api}).Register(s)
	e.srv = httptest.NewServer(s)
	t.Cleanup(e.srv.Close)
	return e
}

type lockedWriter struct{ e *cfgEnv }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.e.mu.Lock()
	defer w.e.mu.Unlock()
	return w.e.logs.Write(p)
}

func (e *cfgEnv) log() string { e.mu.Lock(); defer e.mu.Unlock(); return e.logs.String() }

func (e *cfgEnv) do(method, path, body string, hdr ...string) (int, any) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &v); err != nil {
			e.t.Fatalf("%s %s: not JSON: %q", method, path, raw)
		}
	}
	return resp.StatusCode, v
}

func field(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func TestGatewayConfigAPI(t *testing.T) {
	e := newCfgEnv(t, "", "")
	// Read.
	code, v := e.do("GET", "/admin/v1/gateways", "")
	if list, _ := v.([]any); code != 200 || len(list) != 2 || field(list[0], "source") != "file" || field(list[0], "id") != "default" {
		t.Fatalf("list: %d %v", code, v)
	}
	code, v = e.do("GET", "/admin/v1/gateways/default", "")
	if code != 200 || field(v, "circuit_breaker", "policy") != "base" || field(v, "source") != "file" {
		t.Fatalf("get: %d %v", code, v)
	}
	if code, _ := e.do("GET", "/admin/v1/gateways/nope", ""); code != 404 {
		t.Fatalf("unknown gateway: %d", code)
	}
	// PATCH: objects merge, the answer is the new document.
	code, v = e.do("PATCH", "/admin/v1/gateways/default", `{"circuit_breaker": {"enabled": true, "failure_threshold": 2}}`)
	if code != 200 || field(v, "source") != "admin" || field(v, "circuit_breaker", "failure_threshold") != 2.0 || field(v, "circuit_breaker", "policy") != "base" {
		t.Fatalf("patch: %d %v", code, v)
	}
	if p := e.holder.Load().Gateways["default"].Policy; p.FailureThreshold != 2 || p.CooldownMs != 30000 {
		t.Fatalf("policy in force: %+v", p)
	}
	// null removes a field: the inherited value (the template's) applies.
	code, v = e.do("PATCH", "/admin/v1/gateways/default", `{"circuit_breaker": {"failure_threshold": null}}`)
	if code != 200 || field(v, "circuit_breaker", "failure_threshold") != nil || e.holder.Load().Gateways["default"].Policy.FailureThreshold != 5 {
		t.Fatalf("null: %d %v", code, v)
	}
	// Arrays replace.
	code, _ = e.do("PATCH", "/admin/v1/gateways/default", `{"models": [{"name": "gpt", "routes": ["azure:eu:gpt"]}]}`)
	if m := e.holder.Load().Gateways["default"].Models["gpt"]; code != 200 || len(m.Candidates(nil)) != 1 {
		t.Fatalf("array replace: %d", code)
	}
	// id cannot change.
	if code, v := e.do("PATCH", "/admin/v1/gateways/default", `{"id": "renamed"}`); code != 400 || !strings.Contains(fmt.Sprint(v), "id") {
		t.Fatalf("id change: %d %v", code, v)
	}
	if code, _ := e.do("PATCH", "/admin/v1/gateways/nope", `{}`); code != 404 {
		t.Fatalf("patch unknown: %d", code)
	}
	// PUT creates (201) and replaces (200).
	newGW := `{"circuit_breaker": {"enabled": true}, "models": [{"name": "x", "routes": ["p:r:x", "q:r:x"]}], "routes": [{"key": "p:r:x", "cluster": "cp"}, {"key": "q:r:x", "cluster": "cq"}]}`
	if code, v := e.do("PUT", "/admin/v1/gateways/new", newGW); code != 201 || field(v, "id") != "new" || field(v, "source") != "admin" {
		t.Fatalf("put new: %d %v", code, v)
	}
	if code, _ := e.do("PUT", "/admin/v1/gateways/new", newGW); code != 200 {
		t.Fatalf("put again: %d", code)
	}
	// DELETE: a file gateway gets a tombstone; DELETE .../overlay reverts.
	if code, _ := e.do("DELETE", "/admin/v1/gateways/other", ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if _, ok := e.holder.Load().Gateways["other"]; ok {
		t.Fatal("deleted gateway still in force")
	}
	if code, v := e.do("DELETE", "/admin/v1/gateways/other/overlay", ""); code != 200 || field(v, "source") != "file" {
		t.Fatalf("revert tombstone: %d %v", code, v)
	}
	if code, v := e.do("DELETE", "/admin/v1/gateways/default/overlay", ""); code != 200 || field(v, "source") != "file" || field(v, "circuit_breaker", "failure_threshold") != nil {
		t.Fatalf("revert: %d %v", code, v)
	}
	if code, _ := e.do("DELETE", "/admin/v1/gateways/default/overlay", ""); code != 404 {
		t.Fatalf("revert without overlay: %d", code)
	}
	if code, v := e.do("DELETE", "/admin/v1/gateways/new/overlay", ""); code != 200 || field(v, "deleted") != true {
		t.Fatalf("revert an admin-only gateway: %d %v", code, v)
	}
	if code, _ := e.do("DELETE", "/admin/v1/gateways/new", ""); code != 404 {
		t.Fatalf("delete unknown: %d", code)
	}
	// Each change is one [admin] line naming the fields and the client.
	if l := e.log(); !strings.Contains(l, "[admin] gateway patch") || !strings.Contains(l, "circuit_breaker.failure_threshold") || !strings.Contains(l, "client=127.0.0.1") {
		t.Fatalf("admin log:\n%s", l)
	}
	// Wrong method.
	if code, _ := e.do("POST", "/admin/v1/gateways/default", `{}`); code != 405 {
		t.Fatalf("POST: %d", code)
	}
}

// Every invalid body gets 400 naming the field, and changes nothing.
func TestGatewayConfigValidation(t *testing.T) {
	e := newCfgEnv(t, "", "")
	before := e.holder.Load()
	cases := []struct{ name, body, want string }{
		{"malformed JSON", `{"circuit_breaker": `, "not JSON"},
		{"not an object", `[1]`, "must be a JSON object"},
		{"trailing data", `{} {}`, "trailing data"},
		{"unknown field", `{"circuit_breaker": {"failure_treshold": 3}}`, "circuit_breaker.failure_treshold: unknown field"},
		{"unknown top-level field", `{"modles": []}`, `unknown field "modles"`},
		{"codes string", `{"circuit_breaker": {"failure_status_codes": "500"}}`, "circuit_breaker.failure_status_codes: must be an array"},
		{"codes number", `{"circuit_breaker": {"failure_status_codes": 500}}`, "circuit_breaker.failure_status_codes"},
		{"codes object", `{"circuit_breaker": {"failure_status_codes": {"a": 1}}}`, "non-empty object"},
		{"codes string element", `{"circuit_breaker": {"failure_status_codes": [500, "502"]}}`, "element 1"},
		{"codes fraction", `{"circuit_breaker": {"failure_status_codes": [500.5]}}`, "element 0"},
		{"codes duplicate", `{"circuit_breaker": {"failure_status_codes": [500, 500]}}`, "listed twice"},
		{"codes below 400", `{"circuit_breaker": {"failure_status_codes": [200]}}`, "below 400"},
		{"threshold string", `{"circuit_breaker": {"failure_threshold": "5"}}`, "circuit_breaker.failure_threshold"},
		{"threshold zero", `{"circuit_breaker": {"failure_threshold": 0}}`, "circuit_breaker.failure_threshold: must be a whole number in 1..1000000"},
		{"window huge", `{"circuit_breaker": {"window_sec": 1000000000}}`, "circuit_breaker.window_sec"},
		{"cooldown fraction", `{"circuit_breaker": {"cooldown_ms": 1.5}}`, "circuit_breaker.cooldown_ms"},
		{"enabled string", `{"circuit_breaker": {"enabled": "yes"}}`, "circuit_breaker.enabled"},
		{"mode bad", `{"circuit_breaker": {"mode": "loud"}}`, "circuit_breaker.mode"},
		{"unknown template", `{"circuit_breaker": {"policy": "nope"}}`, "unknown policy template"},
		{"route cluster empty", `{"routes": [{"key": "openai:us:gpt", "cluster": ""}, {"key": "azure:eu:gpt", "cluster": "c2"}]}`, "cluster: must not be empty"},
		{"model route unknown", `{"models": [{"name": "gpt", "routes": ["x:y:z"]}]}`, "is not a route of this gateway"},
		{"models wrong type", `{"models": "gpt"}`, "models: must be a list"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, v := e.do("PATCH", "/admin/v1/gateways/default", tc.body)
			if code != 400 || !strings.Contains(fmt.Sprint(field(v, "error")), tc.want) {
				t.Fatalf("%d %v, want 400 with %q", code, v, tc.want)
			}
			if e.holder.Load() != before {
				t.Fatal("an invalid change replaced the config")
			}
		})
	}
	if b, _ := os.ReadFile(e.persist); len(b) != 0 {
		t.Fatalf("an invalid change was stored: %s", b)
	}
	// Over 1 MiB: 413.
	big := `{"models": [{"name": "` + strings.Repeat("x", MaxBodyBytes) + `"}]}`
	if code, _ := e.do("PUT", "/admin/v1/gateways/default", big); code != 413 {
		t.Fatalf("large body: %d", code)
	}
}

func TestGatewayConfigAuth(t *testing.T) {
	e := newCfgEnv(t, "0123456789abcdef0123", "")
	if code, _ := e.do("GET", "/admin/v1/gateways", ""); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	if code, _ := e.do("PATCH", "/admin/v1/gateways/default", `{}`, "Authorization", "Bearer wrong"); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _ := e.do("PATCH", "/admin/v1/gateways/default", `{}`, "Authorization", "Bearer 0123456789abcdef0123"); code != 200 {
		t.Fatalf("right token: %d", code)
	}
	if code, _ := e.do("PATCH", "/admin/v1/gateways/default", `{}`, "Authorization", "Bearer 0123456789abcdef0123", "Origin", "https://evil.example"); code != 403 {
		t.Fatalf("cross-origin: %d", code)
	}
}

// 50 concurrent PATCHes are serialised: each lands whole, and the final
// document is one of them.
func TestConcurrentPatches(t *testing.T) {
	e := newCfgEnv(t, "", "")
	var wg sync.WaitGroup
	codes := make([]int, 50)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = e.do("PATCH", "/admin/v1/gateways/default", fmt.Sprintf(`{"circuit_breaker": {"failure_threshold": %d, "window_sec": %d}}`, i+1, i+100))
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Fatalf("patch %d: %d", i, c)
		}
	}
	p := e.holder.Load().Gateways["default"].Policy
	if p.WindowSec != p.FailureThreshold+99 {
		t.Fatalf("torn document: threshold %d, window %d", p.FailureThreshold, p.WindowSec)
	}
	_, v := e.do("GET", "/admin/v1/gateways/default", "")
	if field(v, "circuit_breaker", "failure_threshold") != float64(p.FailureThreshold) {
		t.Fatalf("the document and the policy disagree: %v vs %d", v, p.FailureThreshold)
	}
	// The stored overlay is the same document.
	var stored struct {
		Gateways map[string]struct{ Doc any }
	}
	b, _ := os.ReadFile(e.persist)
	if err := json.Unmarshal(b, &stored); err != nil || field(stored.Gateways["default"].Doc, "circuit_breaker", "failure_threshold") != float64(p.FailureThreshold) {
		t.Fatalf("stored overlay: %s", b)
	}
}

// Overlays survive a file reload and a restart; a stored overlay with a
// malformed status list loads with the R-P2 fallback.
func TestOverlaysSurviveReloadAndRestart(t *testing.T) {
	dir := t.TempDir()
	persist := filepath.Join(dir, "overlays.json")
	e := newCfgEnv(t, "", persist)
	if code, _ := e.do("PATCH", "/admin/v1/gateways/default", `{"circuit_breaker": {"failure_threshold": 2}}`); code != 200 {
		t.Fatal(code)
	}
	// A file reload keeps the overlay.
	if _, err := e.mgr.ApplyFile([]byte(strings.Replace(gwFile, "cooldown_ms: 30000", "cooldown_ms: 20000", 1)), nil); err != nil {
		t.Fatal(err)
	}
	if p := e.holder.Load().Gateways["default"].Policy; p.FailureThreshold != 2 || p.CooldownMs != 20000 {
		t.Fatalf("after reload: %+v", p)
	}
	// A restart (a new manager on the same file) keeps it.
	e2 := newCfgEnv(t, "", persist)
	if g := e2.holder.Load().Gateways["default"]; g.Source != "admin" || g.Policy.FailureThreshold != 2 {
		t.Fatalf("after restart: %s %d", g.Source, g.Policy.FailureThreshold)
	}
	// Someone edits the stored overlay by hand with a malformed list.
	var file map[string]any
	b, _ := os.ReadFile(persist)
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	cb := field(file, "gateways", "default", "doc", "circuit_breaker").(map[string]any)
	cb["failure_status_codes"] = "500"
	b, _ = json.Marshal(file)
	if err := os.WriteFile(persist, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var fallbacks []routes.Fallback
	m := &routes.Manager{Store: &routes.FileOverlays{Path: persist}}
	rt, err := m.Open(context.Background(), []byte(gwFile))
	if err != nil {
		t.Fatal(err)
	}
	fallbacks = rt.Fallbacks
	p := rt.Gateways["default"].Policy
	if p.FailureThreshold != 2 || fmt.Sprint(p.FailureStatusCodes) != "[500 502 503 504]" || len(fallbacks) == 0 {
		t.Fatalf("lenient overlay: %+v, fallbacks %v", p, fallbacks)
	}
}

// A wrong type in each field is a 400 that names the field, and changes
// nothing.
func TestGatewayConfigWrongTypeInEveryField(t *testing.T) {
	e := newCfgEnv(t, "", "")
	before := e.holder.Load()
	var bodies []struct{ body, field string }
	for _, f := range routes.PolicyFieldNames() {
		bodies = append(bodies, struct{ body, field string }{fmt.Sprintf(`{"circuit_breaker": {%q: {"x": 1}}}`, f), "circuit_breaker." + f})
	}
	for _, f := range []string{"key", "cluster", "cost_per_mtok", "bias", "residency", "upstream_model", "path", "api", "self_hosted", "fleet"} {
		bodies = append(bodies, struct{ body, field string }{
			fmt.Sprintf(`{"routes": [{"key": "openai:us:gpt", "cluster": "c1", %q: {"x": 1}}, {"key": "azure:eu:gpt", "cluster": "c2"}]}`, f), f})
	}
	for _, f := range []string{"name", "order", "routes"} {
		bodies = append(bodies, struct{ body, field string }{
			fmt.Sprintf(`{"models": [{"name": "gpt", "routes": ["openai:us:gpt"], %q: {"x": 1}}]}`, f), f})
	}
	bodies = append(bodies, struct{ body, field string }{`{"models": {"x": 1}}`, "models"}, struct{ body, field string }{`{"routes": "x"}`, "routes"})
	for _, b := range bodies {
		code, v := e.do("PATCH", "/admin/v1/gateways/default", b.body)
		if code != 400 || !strings.Contains(fmt.Sprint(field(v, "error")), b.field) {
			t.Errorf("%s: %d %v, want 400 naming %s", b.body, code, v, b.field)
		}
	}
	if e.holder.Load() != before {
		t.Fatal("a wrong type changed the config")
	}
}
