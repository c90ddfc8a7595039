package admin

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAuth(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	cases := []struct {
		name     string
		auth     Auth
		header   string
		wantCode int
	}{
		{"token, right", Auth{Token: "t0k"}, "Bearer t0k", 204},
		{"token, wrong", Auth{Token: "t0k"}, "Bearer nope", 401},
		{"token, missing", Auth{Token: "t0k"}, "", 401},
		{"token, wrong scheme", Auth{Token: "t0k"}, "Basic t0k", 401},
		{"scheme in lower case", Auth{Token: "t0k"}, "bearer t0k", 204},
		{"scheme in upper case", Auth{Token: "t0k"}, "BEARER t0k", 204},
		{"token prefix only", Auth{Token: "t0k"}, "Bearer t0", 401},
		{"scheme without token", Auth{Token: "t0k"}, "Bearer", 401},
		{"no token, loopback", Auth{Loopback: true}, "", 204},
		{"no token, not loopback", Auth{}, "", 403},
		{"no token, not loopback, any header", Auth{}, "Bearer x", 403},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/admin/v1/x", nil)
			req.Host = "127.0.0.1:8090"
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			var logs bytes.Buffer
			tc.auth.Log = slog.New(slog.NewTextHandler(&logs, nil))
			req.RemoteAddr = "192.0.2.7:4444"
			tc.auth.Wrap(ok).ServeHTTP(rec, req)
			if rec.Code == 401 {
				// A refusal is logged with the client's address, never
				// with the token it sent.
				if !strings.Contains(logs.String(), "client=192.0.2.7:4444") {
					t.Fatalf("no client address in %q", logs.String())
				}
				if strings.Contains(logs.String(), "nope") || strings.Contains(logs.String(), "t0") {
					t.Fatalf("the log holds the token: %q", logs.String())
				}
			}
			if rec.Code != tc.wantCode {
				t.Fatalf("code %d want %d", rec.Code, tc.wantCode)
			}
			if rec.Code >= 400 && rec.Header().Get("Content-Type") != "application/json" {
				t.Fatal("error is not JSON")
			}
		})
	}
}

func TestHealth(t *testing.T) {
	h := NewHealth("config", "store")
	var last []bool
	h.OnChange(func(s bool) { last = append(last, s) })
	if h.Report().Ready {
		t.Fatal("ready before components")
	}
	h.Set("config", Component{Ready: true})
	h.Set("store", Component{Ready: true, Degraded: true, Detail: "redis down"})
	if r := h.Report(); !r.Ready || !r.Components["store"].Degraded {
		t.Fatalf("degraded store must still be ready: %+v", r)
	}
	h.Drain()
	if r := h.Report(); r.Ready || !r.Draining {
		t.Fatal("draining must not be ready")
	}
	if len(last) != 4 || last[0] || !last[2] || last[3] {
		t.Fatalf("transitions %v", last)
	}
}

// A known path with the wrong method is 405 with Allow, as JSON.
func TestWrongMethodIs405(t *testing.T) {
	s := NewServer(NewHealth(), nil, Auth{Loopback: true})
	s.HandleAPI("GET /admin/v1/things/{id}", func(w http.ResponseWriter, r *http.Request) {})
	s.HandleAPI("POST /admin/v1/things/{id}/poke", func(w http.ResponseWriter, r *http.Request) {})
	cases := []struct {
		method, path string
		code         int
		allow        string
	}{
		{"DELETE", "/admin/v1/things/a", 405, "GET"},
		{"GET", "/admin/v1/things/a/poke", 405, "POST"},
		{"GET", "/admin/v1/nothing", 404, ""},
		{"GET", "/admin/v1/things/a", 200, ""},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(tc.method, tc.path, nil)
		req.Host = "localhost:8090"
		s.ServeHTTP(rec, req)
		if rec.Code != tc.code || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d allow %q, want %d %q", tc.method, tc.path, rec.Code, rec.Header().Get("Allow"), tc.code, tc.allow)
		}
		if rec.Code >= 400 && rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: error is not JSON", tc.method, tc.path)
		}
	}
}

// /debug/pprof is behind the admin token.
func TestPprofNeedsTheToken(t *testing.T) {
	s := NewServer(NewHealth(), nil, Auth{Token: "0123456789abcdef0123", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, tc := range []struct {
		auth string
		code int
	}{{"", 401}, {"Bearer nope", 401}, {"Bearer 0123456789abcdef0123", 200}} {
		req := httptest.NewRequest("GET", "/debug/pprof/goroutine?debug=1", nil)
		req.Host = "fusebox.internal:8090"
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Fatalf("%q: %d, want %d", tc.auth, rec.Code, tc.code)
		}
	}
}

// The dashboard's files are served without a token and cannot be framed.
func TestDashboardServed(t *testing.T) {
	s := NewServer(NewHealth(), nil, Auth{Token: "0123456789abcdef0123"})
	s.RegisterDashboard()
	for path, want := range map[string]string{"/dashboard": "Circuit Breaker", "/dashboard/app.js": "sessionStorage", "/dashboard/style.css": ".state-open"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		s.ServeHTTP(rec, req)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), want) || rec.Header().Get("X-Frame-Options") != "DENY" {
			t.Fatalf("%s: %d %q", path, rec.Code, rec.Header())
		}
	}
}
