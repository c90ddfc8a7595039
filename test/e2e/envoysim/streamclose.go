package envoysim

import (
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// The stream close optimization (docs/envoy.md, "When Envoy closes the
// ext_proc stream"): since 1.37.0 the ext_proc filter closes its gRPC
// stream as soon as the reply it just received is the last one it can
// expect (Filter::closeGrpcStreamIfLastRespReceived, ext_proc.cc), unless
// the runtime guard envoy.reloadable_features.ext_proc_stream_close_optimization
// is false. Before 1.37 the stream stays open until the request ends.
//
// The rules, by the reply just received, with the modes in force after its
// mode_override:
//   - request headers: the request has no body, or its body mode is NONE
//     (and request trailers are not sent), and the response path sends
//     nothing (header SKIP, body NONE, trailers not sent);
//   - request body: only for the last chunk in STREAMED or
//     FULL_DUPLEX_STREAMED; never for a BUFFERED body (envoysim plays
//     BUFFERED request bodies only, so never);
//   - response headers: the response has no body, or its body mode is NONE
//     (and trailers are not sent);
//   - response body: the last STREAMED chunk.

const streamCloseGuard = "envoy.reloadable_features.ext_proc_stream_close_optimization"

// closesEarly reports whether the release played closes streams early.
func (p *Proxy) closesEarly() bool {
	v := p.cfg.Envoy
	if p.cfg.Runtime[streamCloseGuard] == "false" {
		return false
	}
	if v == (Version{}) {
		return true // the current release
	}
	return v.Major > 1 || v.Major == 1 && v.Minor >= 37
}

// responseSendsNothing is the encoding state's noExternalProcess.
func (m modes) responseSendsNothing() bool {
	return !headerMode(m.ResponseHeaderMode, true) && m.ResponseBodyMode == filterv3.ProcessingMode_NONE
}

// afterRequestHeaders closes ep when the request headers reply was its
// last one (noBody: the request had none).
func (p *Proxy) afterRequestHeaders(ep *epStream, noBody bool) {
	if !p.closesEarly() || !ep.active() {
		return
	}
	if (noBody || ep.modes.RequestBodyMode == filterv3.ProcessingMode_NONE) && ep.modes.responseSendsNothing() {
		p.stats.add("streams_closed_early")
		ep.close()
	}
}

// afterResponseHeaders closes ep when the response headers reply was its
// last one.
func (p *Proxy) afterResponseHeaders(ep *epStream, noBody bool) {
	if !p.closesEarly() || !ep.active() {
		return
	}
	if noBody || ep.modes.ResponseBodyMode == filterv3.ProcessingMode_NONE {
		p.stats.add("streams_closed_early")
		ep.close()
	}
}
