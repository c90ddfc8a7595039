package admin

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/metrics"
)

// TestAdminBodyBounds (R-L13): a PATCH nested deeper than 64 levels or with
// more than 10,000 elements is 400 and counted before it is decoded;
// before, the probe's 9,990-deep body was decoded and compiled under the
// config lock.
func TestAdminBodyBounds(t *testing.T) {
	e := newCfgEnv(t, "", "")
	var refused []string
	// The env's Gateways has no counter: count through a second one.
	s := NewServer(NewHealth(), metrics.New().Registry, Auth{Loopback: true, Log: slog.New(slog.DiscardHandler)})
	(&Gateways{Manager: e.mgr, API: &API{Config: e.holder, Log: slog.New(slog.DiscardHandler)}, Refused: func(w string) { refused = append(refused, w) }}).Register(s)
	cases := []struct {
		name, body, want string
	}{
		{"9,990 deep", `{"circuit_breaker":` + strings.Repeat(`{"a":`, 9990) + "1" + strings.Repeat("}", 9990) + `}`, "nested deeper than 64 levels"},
		{"20,000 elements", `{"models":[` + strings.TrimSuffix(strings.Repeat("1,", 20000), ",") + `]}`, "more than 10000 elements"},
	}
	for _, c := range cases {
		req := httptest.NewRequest("PATCH", "/admin/v1/gateways/default", strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Host = "127.0.0.1"
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), c.want) {
			t.Errorf("%s: %d %s", c.name, rec.Code, rec.Body.String())
		}
	}
	if len(refused) != 2 || refused[0] != metrics.RefusedAdminJSON {
		t.Fatalf("counted %v", refused)
	}
}

// TestAdminErrorsEchoBoundedNames (R-L2): every admin error quotes a name
// cut to 256 bytes, and no error body is over 4 KiB; before, a 60 KB name
// came back whole.
func TestAdminErrorsEchoBoundedNames(t *testing.T) {
	e := newCfgEnv(t, "", "")
	long := strings.Repeat("n", 60<<10)
	cases := []struct{ method, path, body string }{
		{"GET", "/admin/v1/gateways/" + long, ""},
		{"GET", "/admin/v1/gateways/default/routes/" + long, ""},
		{"GET", "/admin/v1/fleets/" + long, ""},
		{"POST", "/admin/v1/gateways/default/routes/openai:us:gpt/" + long, ""},
		{"GET", "/admin/v1/" + long, ""},
		{"PUT", "/admin/v1/gateways/g", `{"models":[{"name":"m","routes":["` + long + `"]}],"routes":[{"key":"` + long + `x","cluster":"c"}]}`},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader(c.body))
		if c.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || buf.Len() > 4<<10 || strings.Contains(buf.String(), strings.Repeat("n", 300)) {
			t.Errorf("%s %s…: %d, %d bytes", c.method, c.path[:20], resp.StatusCode, buf.Len())
		}
	}
}

// TestRefusalLogsThrottled: a flood of refused requests is counted in full
// and logged at most once a second per kind, with the path cut; before,
// each refusal wrote its full path.
func TestRefusalLogsThrottled(t *testing.T) {
	var logs bytes.Buffer
	counted := 0
	s := NewServer(NewHealth(), metrics.New().Registry, Auth{Token: "0123456789abcdef", Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Refused: func(string) { counted++ }})
	long := "/admin/v1/" + strings.Repeat("p", 10000)
	for range 200 {
		req := httptest.NewRequest("GET", long, nil)
		s.ServeHTTP(httptest.NewRecorder(), req)
	}
	lines := strings.Count(logs.String(), "[admin] refused")
	if counted != 200 || lines < 1 || lines > 2 {
		t.Fatalf("counted %d, logged %d lines", counted, lines)
	}
	if strings.Contains(logs.String(), strings.Repeat("p", 300)) {
		t.Fatal("the refused path was logged whole")
	}
}
