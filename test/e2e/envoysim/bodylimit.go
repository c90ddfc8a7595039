package envoysim

import (
	"fmt"
	"io"
	"net/http"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// A request body over the connection manager's buffer limit
// (per_connection_buffer_limit_bytes; docs/envoy/body-limit.md):
//
//   - The headers pass the filter chain first: the route role is sent the
//     request headers and decides before any of the body is judged.
//   - While ext_proc waits for the headers' reply it holds the data with a
//     watermark (StopIterationAndWatermark), which pauses the client, never
//     a 413.
//   - A BUFFERED body is then held with StopIterationAndBuffer: the
//     filters are not streaming, so the buffer over its limit calls
//     requestDataTooLarge, which sends a local reply 413
//     (request_payload_too_large, no response flag). The body message is
//     never sent; the local reply takes the response path as the router's
//     own local replies do (1.37+), or is not shown (1.34–1.36).
//   - With no filter buffering (NONE), the body streams to the upstream:
//     no 413.

// overLimit plays a request body over the buffer limit after the request
// headers' phase (body holds the first BufferLimit+1 bytes). It reports
// false when the request ended (the 413). Otherwise it returns the whole
// body: nothing buffers it.
func (p *Proxy) overLimit(w http.ResponseWriter, r *http.Request, entry *Entry, ep *epStream, body []byte) ([]byte, bool) {
	if ep.active() && ep.modes.RequestBodyMode == filterv3.ProcessingMode_BUFFERED {
		p.stats.add("downstream_rq_too_large")
		entry.Details = "request_payload_too_large"
		lr := localReply(413, 0, "request_payload_too_large", "Payload Too Large")
		lr.beforeRouter = true
		if p.cfg.Envoy.SkipsLocalReplies(p.cfg.Runtime) {
			ep.close()
			p.writeLocal(w, entry, lr)
			return nil, false
		}
		p.respond(w, r, entry, ep, lr)
		return nil, false
	}
	if f := p.cfg.Failover; f != nil && f.Attempt.Addr != "" && f.Attempt.RequestBodyMode == filterv3.ProcessingMode_BUFFERED {
		// The upstream filter chain's own buffer limit is not played:
		// refused loudly rather than passed kindly.
		p.writeLocal(w, entry, localReply(500, 0, "envoysim_does_not_play_an_attempt_body_over_the_limit", "envoysim: not played"))
		return nil, false
	}
	rest, err := io.ReadAll(r.Body)
	if err != nil {
		entry.Reset = true
		return nil, false
	}
	return append(body, rest...), true
}

// playedRequestBodyModes are the request body modes envoysim plays: a
// filter configured with another (STREAMED, BUFFERED_PARTIAL,
// FULL_DUPLEX_STREAMED) is refused (New), as would be a mode override to
// one (playsOverride: the request ends in a 500 that names it).
var playedRequestBodyModes = map[filterv3.ProcessingMode_BodySendMode]bool{
	filterv3.ProcessingMode_NONE: true, filterv3.ProcessingMode_BUFFERED: true,
}

// checkBodyModes refuses a filter whose request body mode envoysim does not
// play: it would send the processor nothing of the body, where Envoy would
// stream it.
func (c *Config) checkBodyModes() error {
	for name, f := range c.filters() {
		if !playedRequestBodyModes[f.RequestBodyMode] {
			return fmt.Errorf("envoysim: the %s's request_body_mode %v is not one it plays", name, f.RequestBodyMode)
		}
	}
	return nil
}

// playsOverride ends the request with a 500 naming what is not played when
// a mode override asks for a request body mode envoysim does not play.
func (p *Proxy) playsOverride(w http.ResponseWriter, e *Entry, ep *epStream) bool {
	if playedRequestBodyModes[ep.modes.RequestBodyMode] {
		return true
	}
	p.writeLocal(w, e, localReply(500, 0, "envoysim_does_not_play_request_body_mode_"+ep.modes.RequestBodyMode.String(), "envoysim: not played"))
	return false
}
