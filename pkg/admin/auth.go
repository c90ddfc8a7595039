package admin

import (
	"crypto/subtle"
	"log/slog"
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
	// Log receives one line per refused request, with the client's address
	// (never the token it sent). Nil: slog.Default().
	Log *slog.Logger
	// Refused, when set, counts each refusal by what was refused.
	Refused func(what string)

	// throttle bounds the refusal lines (NewServer sets it; nil = every
	// refusal is logged).
	throttle *logThrottle
}

// IsLoopbackAddr reports whether a listener address is a loopback one;
// a Unix domain socket is reached only on this host, so it counts as one.
func IsLoopbackAddr(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	return false
}

// Wrap returns next behind the R-L4 guards and the token check.
func (a Auth) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.guard(w, r) {
			return
		}
		if a.Token == "" {
			if !a.Loopback {
				WriteError(w, http.StatusForbidden, "the admin API is served only on a loopback listener when no token is set")
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if !a.tokenMatches(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fusebox"`)
			a.refuse(w, r, "admin_auth", http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// tokenMatches checks an Authorization header: the scheme is
// case-insensitive (RFC 7235: "bearer" and "Bearer" are the same), the
// comparison constant-time.
func (a Auth) tokenMatches(h string) bool {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(cred)), []byte(a.Token)) == 1
}

func (a Auth) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.Default()
}
