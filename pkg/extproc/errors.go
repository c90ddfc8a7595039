package extproc

import (
	"encoding/json"

	"github.com/fusebox-llm/fusebox/pkg/echo"
)

// MaxErrorBody bounds every error body fusebox sends (R-L2).
const MaxErrorBody = echo.MaxErrorBody

// errorBody is the OpenAI-style JSON error. The message is cut so that the
// body stays within MaxErrorBody whatever it holds.
func ErrorBody(typ, code, msg string) []byte {
	for {
		b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": typ, "code": code}})
		if len(b) <= MaxErrorBody || msg == "" {
			return b
		}
		msg = Clip(msg, len(msg)/2)
	}
}

// anthropicErrorBody is Anthropic's error shape (R-D9):
// {"type":"error","error":{"type":T,"message":M}}, T by status. The
// message names fusebox's code, which the shape has no field for.
func AnthropicErrorBody(status int, code, msg string) []byte {
	t := "api_error"
	switch status {
	case 400:
		t = "invalid_request_error"
	case 404:
		t = "not_found_error"
	case 413:
		t = "request_too_large"
	case 503:
		t = "overloaded_error"
	}
	msg = code + ": " + msg
	for {
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": t, "message": msg}})
		if len(b) <= MaxErrorBody || msg == "" {
			return b
		}
		msg = Clip(msg, len(msg)/2)
	}
}

// echoName returns a client-supplied name fit to repeat in an error.
func EchoName(s string) string { return echo.Name(s) }

func Clip(s string, n int) string { return echo.Clip(s, n) }

const (
	TypeInvalidRequest = "invalid_request_error"
	TypeUnavailable    = "service_unavailable"
	CodeGatewayUnknown = "gateway_not_found"
	CodeModelUnknown   = "model_not_found"
	CodeInvalid        = "invalid_request"
	CodeAllOpen        = "all_routes_open"
)
