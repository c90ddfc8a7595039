package processor

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"google.golang.org/protobuf/types/known/structpb"
)

// headerValue returns a header's value. Envoy sends raw_value (bytes) and
// leaves value empty (docs/ext_proc.md); value is read only when raw_value is empty,
// for other clients.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.RawValue) > 0 {
		return string(h.RawValue)
	}
	return h.Value
}

// setHeader builds an overwrite of one header. Only raw_value is set:
// Envoy reads nothing else, and setting both fails the request.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
}

// attrKey is where Envoy puts the CEL attributes of the ext_proc filter.
const attrKey = "envoy.filters.http.ext_proc"

// attributes reads response.flags (a number) and response.code_details.
func attributes(attrs map[string]*structpb.Struct) (flags uint64, hasFlags bool, details string, hasDetails bool) {
	st := attrs[attrKey]
	if st == nil {
		return
	}
	if v, ok := st.Fields["response.flags"]; ok {
		switch k := v.Kind.(type) {
		case *structpb.Value_NumberValue:
			if k.NumberValue >= 0 {
				flags, hasFlags = uint64(k.NumberValue), true
			}
		case *structpb.Value_StringValue:
			var n uint64
			ok := len(k.StringValue) > 0
			for _, c := range k.StringValue {
				if c < '0' || c > '9' {
					ok = false
					break
				}
				n = n*10 + uint64(c-'0')
			}
			flags, hasFlags = n, ok
		}
	}
	if v, ok := st.Fields["response.code_details"]; ok {
		if s, ok := v.Kind.(*structpb.Value_StringValue); ok {
			details, hasDetails = s.StringValue, true
		}
	}
	return
}

func isJSONContentType(ct string) bool {
	ct = strings.ToLower(strings.TrimSpace(ct))
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = strings.TrimSpace(ct[:i])
	}
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}

func headersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func bodyReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func responseHeadersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

// immediate builds an OpenAI-style JSON error reply sent by Envoy as a local
// reply.
func immediate(status int, typ, code, msg string, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return immediateBody(status, code, errorBody(typ, code, msg), extra...)
}

// errorReply is an error fusebox answers itself, in the client's dialect
// (R-D9): Anthropic's shape for a model whose routes speak api anthropic,
// or, with no model known, for a request to /v1/messages; OpenAI's
// otherwise (the Responses API included). Before, Anthropic clients got
// OpenAI's shape and the SDK's message was the raw JSON text.
func (st *stream) errorReply(status int, typ, code, msg string, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	if st.anthropicClient() {
		return immediateBody(status, code, anthropicErrorBody(status, code, msg), extra...)
	}
	return immediate(status, typ, code, msg, extra...)
}

func (st *stream) anthropicClient() bool {
	if st.model != nil {
		return st.model.API == routes.APIAnthropic
	}
	return st.path == "/v1/messages" || strings.HasPrefix(st.path, "/v1/messages?") || strings.HasPrefix(st.path, "/v1/messages/")
}

func immediateBody(status int, code string, body []byte, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	hdrs := append([]*corev3.HeaderValueOption{setHeader("content-type", "application/json")}, extra...)
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: hdrs},
		Body:    body,
		Details: "fusebox_" + code,
	}}}
}

// modeOverride sets the request body mode and repeats the response modes
// the deployment gives this role (docs/ext_proc.md: the override is taken
// literally, so the modes kept are repeated). It never turns on a phase
// the deployment keeps off: in the failover deployment (envoy.failover)
// the route role (its only caller) has no response phases at all (R-X8), and Envoy's
// protocol_config tells only the body modes, so the header mode comes from
// the config.
func (st *stream) modeOverride(reqBody filterv3.ProcessingMode_BodySendMode) *filterv3.ProcessingMode {
	m := &filterv3.ProcessingMode{
		RequestBodyMode:    reqBody,
		ResponseHeaderMode: filterv3.ProcessingMode_SEND,
		ResponseBodyMode:   st.respBodyMode,
	}
	if st.rt != nil && (st.rt.Envoy.Failover || st.rt.Envoy.Observer) {
		m.ResponseHeaderMode, m.ResponseBodyMode = filterv3.ProcessingMode_SKIP, filterv3.ProcessingMode_NONE
	}
	return m
}

// stageMetadata is the dynamic metadata of R-M2/R-M3 in namespace fusebox.
//
// would, when not empty, lists routes that shadow breakers would have
// skipped besides the action's own routes (R-M4).
func stageMetadata(action, routes, would string) *structpb.Struct {
	f := map[string]*structpb.Value{
		"stage":  structpb.NewStringValue("circuit_breaker"),
		"action": structpb.NewStringValue(action),
		"routes": structpb.NewStringValue(routes),
	}
	if would != "" {
		f["would_skip"] = structpb.NewStringValue(would)
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"fusebox": structpb.NewStructValue(&structpb.Struct{Fields: f}),
	}}
}

// withDecision names the decision in the fusebox namespace (R-AL2), where
// Envoy's access log entry carries it back.
func withDecision(stage *structpb.Struct, id string) *structpb.Struct {
	if stage == nil {
		return &structpb.Struct{Fields: map[string]*structpb.Value{
			"fusebox": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"decision": structpb.NewStringValue(id)}}),
		}}
	}
	stage.Fields["fusebox"].GetStructValue().Fields["decision"] = structpb.NewStringValue(id)
	return stage
}
