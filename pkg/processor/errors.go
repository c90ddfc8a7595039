package processor

import (
	"encoding/json"
	"unicode/utf8"
)

// maxErrorBody bounds every error body fusebox sends (R-L2).
const maxErrorBody = 4 << 10

// maxEchoedName bounds a client-supplied name (model, gateway, residency)
// repeated in an error (R-L2): echoing it whole let a client make fusebox
// quote and escape megabytes per request.
const maxEchoedName = 256

// errorBody is the OpenAI-style JSON error. The message is cut so that the
// body stays within maxErrorBody whatever it holds.
func errorBody(typ, code, msg string) []byte {
	for {
		b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": typ, "code": code}})
		if len(b) <= maxErrorBody || msg == "" {
			return b
		}
		msg = clip(msg, len(msg)/2)
	}
}

// echo returns a client-supplied name fit to repeat in an error: at most
// maxEchoedName bytes, cut on a character boundary, marked when cut.
func echo(s string) string { return clip(s, maxEchoedName) }

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

const (
	typeInvalidRequest = "invalid_request_error"
	typeUnavailable    = "service_unavailable"
	codeGatewayUnknown = "gateway_not_found"
	codeModelUnknown   = "model_not_found"
	codeInvalid        = "invalid_request"
	codeAllOpen        = "all_routes_open"
)
