package processor

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// errorReply is an error fusebox answers itself, in the client's dialect
// (R-D9): Anthropic's shape for a model whose routes speak api anthropic,
// or, with no model known, for a request to /v1/messages; OpenAI's
// otherwise (the Responses API included). Before, Anthropic clients got
// OpenAI's shape and the SDK's message was the raw JSON text.
func (st *stream) errorReply(status int, typ, code, msg string, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	if st.anthropicClient() {
		return extproc.ImmediateBody(status, code, extproc.AnthropicErrorBody(status, code, msg), extra...)
	}
	return extproc.Immediate(status, typ, code, msg, extra...)
}

func (st *stream) anthropicClient() bool {
	if st.model != nil {
		return st.model.API == routes.APIAnthropic
	}
	return st.path == "/v1/messages" || strings.HasPrefix(st.path, "/v1/messages?") || strings.HasPrefix(st.path, "/v1/messages/")
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
