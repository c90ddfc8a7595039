package processor

import "encoding/json"

// errorBody renders the OpenAI-style error object clients of an LLM gateway
// already parse: {"error":{"message","type","code"}}.
func errorBody(typ, code, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": typ, "code": code}})
	return b
}

const (
	typeInvalidRequest = "invalid_request_error"
	typeUnavailable    = "service_unavailable"
	codeGatewayUnknown = "gateway_not_found"
	codeModelUnknown   = "model_not_found"
	codeInvalid        = "invalid_request"
	codeAllOpen        = "all_routes_open"
)
