package envoysim

import (
	"strconv"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// The stream close optimization (docs/envoy.md, "When Envoy closes the
// ext_proc stream"): since 1.37.0 the ext_proc filter closes its gRPC
// stream as soon as the reply it just received is the last one it can
// expect (Filter::closeGrpcStreamIfLastRespReceived, ext_proc.cc), unless
// the runtime guard envoy.reloadable_features.ext_proc_stream_close_optimization
// is false on 1.37–1.39. 1.40.0 removed the guard and its legacy code path
// (changelogs/1.40.0.yaml, removed_config_or_runtime): a false there is a
// key Envoy no longer reads. Before 1.37 the stream stays open until the
// request ends.
//
// Besides, as the response headers pass the filter, a stream whose
// encoding path has nothing to send (header SKIP, body NONE, trailers not
// sent: the route role of the observer and failover profiles) is closed
// there (Filter::encodeHeaders, "no external processing configured in the
// encoding path" → closeStreamMaybeGraceful), with no guard in the source
// read; it is played from 1.37.
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

// closesEarly reports whether the release played closes streams after
// their last expected reply.
func (p *Proxy) closesEarly() bool {
	v := p.cfg.Envoy
	switch {
	case v.AtLeast(1, 40):
		return true // the guard is gone
	case v.AtLeast(1, 37):
		return p.cfg.Runtime[streamCloseGuard] != "false"
	}
	return false
}

// atEncodeHeaders closes ep as the response headers pass the filter when
// its encoding path sends nothing (Filter::encodeHeaders, 1.37+).
func (p *Proxy) atEncodeHeaders(ep *epStream) {
	if ep == nil || !p.cfg.Envoy.AtLeast(1, 37) || !ep.active() || !ep.modes.responseSendsNothing() {
		return
	}
	p.stats.add("streams_closed_at_encode_headers")
	ep.close()
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

// The close itself (ExternalProcessorStreamImpl::close): a half-close, then
// at once a reset, so a reply the server sends after the half-close (one
// that came after a message timeout) is never read. With the runtime guard
// ext_proc_graceful_grpc_close (1.34.0+, default false in every
// runtime_features.cc that could be read) the filter waits for the
// server's own half-close, up to remote_close_timeout_milliseconds (1 s
// by default), reading and ignoring what comes meanwhile.
const (
	gracefulCloseGuard = "envoy.reloadable_features.ext_proc_graceful_grpc_close"
	remoteCloseTimeout = "envoy.filters.http.ext_proc.remote_close_timeout_milliseconds"
)

// gracefulClose reports whether the release played closes gracefully, and
// how long it then waits for the server's half-close.
func (p *Proxy) gracefulClose() (time.Duration, bool) {
	if p.cfg.Runtime[gracefulCloseGuard] != "true" || !p.cfg.Envoy.AtLeast(1, 34) {
		return 0, false
	}
	ms := 1000
	if v, err := strconv.Atoi(p.cfg.Runtime[remoteCloseTimeout]); err == nil && v > 0 {
		ms = v
	}
	return time.Duration(ms) * time.Millisecond, true
}
