package echo

import "unicode/utf8"

const (
	// MaxName bounds a name (model, gateway, route, path) repeated in an
	// error: echoing it whole let a sender make fusebox quote and escape
	// megabytes per request.
	MaxName = 256
	// MaxErrorBody bounds every error body.
	MaxErrorBody = 4 << 10
)

// Name returns s fit to repeat in an error: at most MaxName bytes, cut on a
// character boundary, marked when cut.
func Name(s string) string { return Clip(s, MaxName) }

// Clip cuts s to at most n bytes on a character boundary, adding "…" when
// it cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
