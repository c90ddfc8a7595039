package admin

import (
	"net/http"
	"net/http/httptest"
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
		{"no token, loopback", Auth{Loopback: true}, "", 204},
		{"no token, not loopback", Auth{}, "", 403},
		{"no token, not loopback, any header", Auth{}, "Bearer x", 403},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/admin/v1/x", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			tc.auth.Wrap(ok).ServeHTTP(rec, req)
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
