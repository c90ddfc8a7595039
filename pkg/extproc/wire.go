package extproc

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// headerValue returns a header's value. Envoy sends raw_value (bytes) and
// leaves value empty (docs/ext_proc.md); value is read only when raw_value is empty,
// for other clients.
func HeaderValue(h *corev3.HeaderValue) string {
	if len(h.RawValue) > 0 {
		return string(h.RawValue)
	}
	return h.Value
}

// setHeader builds an overwrite of one header. Only raw_value is set:
// Envoy reads nothing else, and setting both fails the request.
func SetHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
}

// AttrKey is where Envoy puts the CEL attributes of the ext_proc filter.
const AttrKey = "envoy.filters.http.ext_proc"

// attributes reads response.flags (a number) and response.code_details.
func Attributes(attrs map[string]*structpb.Struct) (flags uint64, hasFlags bool, details string, hasDetails bool) {
	st := attrs[AttrKey]
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

func IsJSONContentType(ct string) bool {
	ct = strings.ToLower(strings.TrimSpace(ct))
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = strings.TrimSpace(ct[:i])
	}
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}

func HeadersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func BodyReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func ResponseHeadersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

// Immediate builds an OpenAI-style JSON error reply sent by Envoy as a local
// reply.
func Immediate(status int, typ, code, msg string, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return ImmediateBody(status, code, ErrorBody(typ, code, msg), extra...)
}

// DetailsPrefix begins the details of every immediate response fusebox
// sends (Envoy logs them as response_code_details): fusebox_<code>.
const DetailsPrefix = "fusebox_"

// ImmediateBody is an immediate response with body as it is, its details
// fusebox_<code>.
func ImmediateBody(status int, code string, body []byte, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	hdrs := append([]*corev3.HeaderValueOption{SetHeader("content-type", "application/json")}, extra...)
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: hdrs},
		Body:    body,
		Details: DetailsPrefix + code,
	}}}
}

// stageMetadata is the dynamic metadata of R-M2/R-M3 in namespace fusebox.
//
// would, when not empty, lists routes that shadow breakers would have
// skipped besides the action's own routes (R-M4).
func StageMetadata(action, routes, would string) *structpb.Struct {
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
func WithDecision(stage *structpb.Struct, id string) *structpb.Struct {
	if stage == nil {
		return &structpb.Struct{Fields: map[string]*structpb.Value{
			"fusebox": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"decision": structpb.NewStringValue(id)}}),
		}}
	}
	stage.Fields["fusebox"].GetStructValue().Fields["decision"] = structpb.NewStringValue(id)
	return stage
}
