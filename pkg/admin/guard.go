package admin

import (
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/echo"
)

// MaxBodyBytes bounds an admin request body (R-L4).
const MaxBodyBytes = 1 << 20

// guard applies R-L4 before authentication: a web page must not be able to
// drive the admin API from an operator's browser, and a DNS-rebound name
// must not reach a token-less API on loopback. It reports whether the
// request may go on, having answered it otherwise.
func (a Auth) guard(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength > MaxBodyBytes {
		a.refuse(w, r, "admin_body_too_large", http.StatusRequestEntityTooLarge, "the body is over 1 MiB")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	if a.Token == "" && !loopbackHost(r.Host) {
		a.refuse(w, r, "admin_host", http.StatusForbidden, "without a token the admin API answers only to a loopback Host (localhost, 127.0.0.1, [::1])")
		return false
	}
	if !changesState(r.Method) {
		return true
	}
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		a.refuse(w, r, "admin_cross_origin", http.StatusForbidden, "a change must not come from another origin")
		return false
	}
	// A browser sends a cross-site form or a no-preflight fetch with
	// text/plain, a form type or no type: only JSON is taken, and a request
	// without a type only when it has no body.
	ct := r.Header.Get("Content-Type")
	if ct == "" && (r.ContentLength == 0 || r.ContentLength == -1 && r.Body == http.NoBody) {
		return true
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		a.refuse(w, r, "admin_content_type", http.StatusUnsupportedMediaType, "changes take Content-Type: application/json")
		return false
	}
	return true
}

func (a Auth) refuse(w http.ResponseWriter, r *http.Request, what string, code int, msg string) {
	if a.Refused != nil {
		a.Refused(what)
	}
	// Counted always; logged at most once a second per kind, with the path
	// cut (R-L13): the path is the sender's.
	if ok, held := a.throttle.allow(what); ok {
		args := []any{"client", r.RemoteAddr, "method", echo.Name(r.Method), "path", echo.Name(r.URL.Path)}
		if held > 0 {
			args = append(args, "similar_refusals_not_logged", held)
		}
		a.log().Warn("[admin] refused: "+msg, args...)
	}
	WriteError(w, code, msg)
}

func changesState(m string) bool {
	switch m {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// loopbackHost reports whether a Host header names this machine by a
// loopback name or address.
func loopbackHost(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") || strings.HasSuffix(strings.ToLower(h), ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// sameOrigin reports whether an Origin header names the host the request
// was sent to.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false // includes "null"
	}
	return strings.EqualFold(u.Host, host)
}
