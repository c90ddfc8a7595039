package admin

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strings"
)

// Auth guards /admin/v1 (SPEC §8): with a token, every request must carry
// `Authorization: Bearer <token>`; without one, the API is served only when
// the admin listener is on a loopback address, and answers 403 elsewhere.
type Auth struct {
	Token    string
	Loopback bool
}

// IsLoopbackAddr reports whether a listener address is a loopback one.
func IsLoopbackAddr(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// Wrap returns next behind the token check.
func (a Auth) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.Token == "" {
			if !a.Loopback {
				WriteError(w, http.StatusForbidden, "the admin API is served only on a loopback listener when no token is set")
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(a.Token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fusebox"`)
			WriteError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}
