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

// R-L4: what a web page or a neighbour can send is refused before auth.
func TestGuard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			WriteError(w, http.StatusRequestEntityTooLarge, err.Error())
			return
		}
		w.WriteHeader(204)
	})
	big := strings.Repeat("x", MaxBodyBytes+1)
	cases := []struct {
		name    string
		auth    Auth
		method  string
		host    string
		headers map[string]string
		body    string
		chunked bool
		code    int
		what    string
	}{
		// The browser attack of the security probe: no preflight, a
		// foreign Origin and Host, text/plain.
		{"drive-by force-open", Auth{Loopback: true}, "POST", "attacker.example", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"}, "", false, 403, "admin_host"},
		{"rebound name, loopback listener", Auth{Loopback: true}, "GET", "attacker.example:8090", nil, "", false, 403, "admin_host"},
		{"cross-origin from loopback host", Auth{Loopback: true}, "POST", "127.0.0.1:8090", map[string]string{"Origin": "https://evil.example", "Content-Type": "application/json"}, "{}", false, 403, "admin_cross_origin"},
		{"null origin", Auth{Loopback: true}, "POST", "127.0.0.1:8090", map[string]string{"Origin": "null", "Content-Type": "application/json"}, "{}", false, 403, "admin_cross_origin"},
		{"text/plain change", Auth{Loopback: true}, "POST", "127.0.0.1:8090", map[string]string{"Content-Type": "text/plain"}, "{}", false, 415, "admin_content_type"},
		{"form change", Auth{Token: "0123456789abcdef"}, "POST", "fusebox.internal", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Bearer 0123456789abcdef"}, "a=1", false, 415, "admin_content_type"},
		{"body without a type", Auth{Loopback: true}, "POST", "127.0.0.1:8090", nil, "{}", false, 415, "admin_content_type"},
		{"too large", Auth{Loopback: true}, "POST", "127.0.0.1:8090", map[string]string{"Content-Type": "application/json"}, big, false, 413, "admin_body_too_large"},
		{"too large, chunked", Auth{Loopback: true}, "POST", "127.0.0.1:8090", map[string]string{"Content-Type": "application/json"}, big, true, 413, ""},
		// What must pass.
		{"same origin JSON", Auth{Loopback: true}, "POST", "127.0.0.1:8090", map[string]string{"Origin": "http://127.0.0.1:8090", "Content-Type": "application/json; charset=utf-8"}, "{}", false, 204, ""},
		{"curl without body", Auth{Loopback: true}, "POST", "localhost:8090", nil, "", false, 204, ""},
		{"ipv6 loopback", Auth{Loopback: true}, "GET", "[::1]:8090", nil, "", false, 204, ""},
		{"token, any host", Auth{Token: "0123456789abcdef"}, "GET", "fusebox.internal:8090", map[string]string{"Authorization": "Bearer 0123456789abcdef"}, "", false, 204, ""},
		{"token, wrong", Auth{Token: "0123456789abcdef"}, "GET", "fusebox.internal:8090", map[string]string{"Authorization": "Bearer nope"}, "", false, 401, "admin_auth"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var refused []string
			tc.auth.Refused = func(w string) { refused = append(refused, w) }
			tc.auth.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(bytes.NewReader([]byte(tc.body))) // unknown length
			}
			req := httptest.NewRequest(tc.method, "/admin/v1/gateways/default/routes/r/force-open", body)
			if tc.chunked {
				req.ContentLength = -1
			}
			req.Host = tc.host
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			tc.auth.Wrap(ok).ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("code %d, want %d (%s)", rec.Code, tc.code, rec.Body.String())
			}
			if tc.what != "" && (len(refused) != 1 || refused[0] != tc.what) {
				t.Fatalf("counted %v, want %s", refused, tc.what)
			}
		})
	}
}
