package envoysim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// attrKey is where Envoy puts the filter's CEL attributes.
const attrKey = "envoy.filters.http.ext_proc"

// attributes evaluates the configured response attributes once, for the
// first message of the response direction: ints become numbers.
func (p *Proxy) attributes(c *ExtProcConfig, up *response) map[string]*structpb.Struct {
	if len(c.ResponseAttributes) == 0 {
		return nil
	}
	f := map[string]*structpb.Value{}
	for _, a := range c.ResponseAttributes {
		switch a {
		case "response.flags":
			f[a] = structpb.NewNumberValue(float64(up.flags))
		case "response.code_details":
			f[a] = structpb.NewStringValue(up.details)
		case "response.code":
			f[a] = structpb.NewNumberValue(float64(up.status))
		}
	}
	return map[string]*structpb.Struct{attrKey: {Fields: f}}
}

// chunkSize is how much of an upstream body one data frame carries at most.
const chunkSize = 16 << 10

// respond runs the response phase: headers through ext_proc, then the body
// chunk by chunk (STREAMED: one message per chunk, pipelined, each chunk
// forwarded once its own reply arrives, under the direction's one message
// timer: dirTimer), then ends the ext_proc stream.
func (p *Proxy) respond(w http.ResponseWriter, r *http.Request, e *Entry, ep *epStream, up *response) {
	streamed := func() bool { return ep.active() && ep.modes.ResponseBodyMode == filterv3.ProcessingMode_STREAMED }
	h := headers{{":status", strconv.Itoa(up.status)}}
	h = append(h, up.hdr...)
	noBody := r.Method == http.MethodHead
	if cl, ok := up.hdr.get("content-length"); ok && cl == "0" {
		noBody = true
	}
	// The observer filter comes after the route role's in the decoder
	// chain, so before it in the encoder chain: it sees the response as
	// the upstream sent it, and never waits (observe.go).
	obs := p.newObserver(e, e.RequestID)
	defer obs.close()
	downstream := func() {
		p.finalizeResponse(e, up, &h)
		if obs != nil {
			oh := append(headers(nil), h...)
			if p.cfg.Observer.ResponseBodyMode == filterv3.ProcessingMode_STREAMED {
				oh.del("content-length")
			}
			obs.headers(oh, noBody, up)
		}
	}
	// The attempt role is an upstream filter: it sees the response as the
	// upstream sent it, before the router finalizes it (upstream_request.cc
	// decodeHeaders, then the router's onUpstreamHeaders). A downstream
	// filter sees it after.
	upstreamFilter := p.cfg.Failover != nil && ep.c == &p.cfg.Failover.Attempt
	if !upstreamFilter {
		downstream()
	}
	if !p.responseHeadersPhase(w, e, ep, up, &h, noBody, streamed) {
		return
	}
	if upstreamFilter {
		downstream()
	}
	// The route role's filter comes before the attempt role's upstream
	// filter on the way down and after it on the way back.
	p.atEncodeHeaders(e.routeEP)
	status, _ := strconv.Atoi(mustGet(h, ":status"))
	for _, x := range h {
		if x.k[0] != ':' {
			w.Header().Add(x.k, x.v)
		}
	}
	if streamed() {
		w.Header().Del("content-length")
	}
	w.WriteHeader(status)
	e.Status = status
	e.FuseboxRoute = w.Header().Get("x-fusebox-route")
	for i, hs := range rateLimitHeaders {
		if e.RateLimit[i] = w.Header().Get(hs[0]); e.RateLimit[i] == "" {
			e.RateLimit[i] = w.Header().Get(hs[1])
		}
	}
	e.FirstByte = time.Since(e.Start)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	if noBody {
		if streamed() {
			ep.close()
		}
		return
	}

	if !streamed() {
		// The stream ends with the request (after the body), unless the
		// release closed it already: after the response headers reply
		// (afterResponseHeaders) or as the headers passed a filter whose
		// encoding path sends nothing (atEncodeHeaders), both 1.37+.
		// Before, envoysim closed it here on every release.
		defer ep.close()
		// Each chunk goes to the observer, if any, and on to the client at
		// once.
		buf := make([]byte, chunkSize)
		for {
			n, err := up.body.Read(buf)
			if n > 0 {
				at := time.Now()
				c := append([]byte(nil), buf[:n]...)
				if obs != nil {
					obs.body(c, false)
				}
				if _, werr := w.Write(c); werr != nil {
					e.Reset = true
					return
				}
				flush()
				p.stats.chunk(time.Since(at))
			}
			if errors.Is(err, io.EOF) {
				obs.finish(up)
				writeTrailers(w, up)
				return
			}
			if err != nil {
				e.Reset = true
				e.Flags |= cutFlags(err)
				panic(http.ErrAbortHandler) // upstream reset after headers: reset downstream
			}
		}
	}

	// STREAMED: the reader sends each chunk as it arrives without waiting;
	// this goroutine forwards chunk i once reply i arrives.
	type sent struct {
		chunk []byte
		at    time.Time
		eos   bool
		// trailers, in trailer mode SEND, go out only once every chunk's
		// reply is in ("no data pending for processing": handleBodyResponse).
		trailers *extprocv3.ProcessingRequest
	}
	queue := make(chan sent, 256)
	upErr := make(chan error, 1)
	timer := newDirTimer(ep.c.MessageTimeout)
	go func() {
		defer close(queue)
		buf := make([]byte, chunkSize)
		for {
			n, err := up.body.Read(buf)
			if n > 0 {
				c := append([]byte(nil), buf[:n]...)
				s := sent{chunk: c, at: time.Now()}
				if ep.active() {
					if serr := ep.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: c}}}); serr != nil {
						s.at = time.Time{}
					} else {
						timer.arm(s.at)
					}
				}
				queue <- s
			}
			if err == io.EOF {
				s := sent{at: time.Now(), eos: true}
				if ep.active() {
					switch msg := endMessage(ep.c, up); {
					case msg == nil:
						// Trailers in SKIP mode: the body's end is never
						// sent (processor_state.cc); nothing to wait for.
						s.at = time.Time{}
						p.stats.add("body_end_not_sent")
					case msg.GetResponseTrailers() != nil:
						s.trailers = msg
					case ep.send(msg) == nil:
						timer.arm(s.at)
					}
				}
				queue <- s
				return
			}
			if err != nil {
				upErr <- err
				return
			}
		}
	}()
	processing := true
	for s := range queue {
		out := s.chunk
		if s.trailers != nil && processing && ep.active() {
			s.at = time.Now()
			if ep.send(s.trailers) == nil {
				timer.arm(s.at)
			} else {
				s.at = time.Time{}
			}
		}
		if processing && ep.active() && !s.at.IsZero() {
			resp, err := ep.nextOn(timer)
			if err != nil {
				if !ep.fail(err) {
					e.Reset = true
					panic(http.ErrAbortHandler)
				}
				processing = false
			} else if x, ok := resp.Response.(*extprocv3.ProcessingResponse_ResponseBody); ok {
				if nb, replaced := bodyMutation(x.ResponseBody.GetResponse(), out); replaced {
					out = nb
				}
				p.keepMetadata(e, ep.c, resp)
			} else if _, ok := resp.Response.(*extprocv3.ProcessingResponse_ResponseTrailers); ok && s.eos {
				p.keepMetadata(e, ep.c, resp)
			} else {
				p.stats.add("spurious_msgs_received")
				if !ep.fail(errSpurious) {
					e.Reset = true
					panic(http.ErrAbortHandler)
				}
				processing = false
			}
		}
		if obs != nil && len(s.chunk) > 0 {
			obs.body(s.chunk, false)
		}
		if s.eos {
			obs.finish(up)
		}
		if len(out) > 0 {
			if _, err := w.Write(out); err != nil {
				// The client went away: Envoy resets the ext_proc stream,
				// and the entry says DC (an HTTP/1 client's connection).
				e.Reset = true
				e.Flags |= flagDC
				p.cutEnd(e, ep)
				return
			}
			flush()
			if !s.at.IsZero() {
				p.stats.chunk(time.Since(s.at))
			}
		}
		if r.Context().Err() != nil {
			e.Reset = true
			e.Flags |= flagDC
			p.cutEnd(e, ep)
			return
		}
	}
	writeTrailers(w, up)
	select {
	case err := <-upErr:
		// Upstream reset after headers: the downstream stream is reset
		// and the processor sees no end_of_stream.
		e.Reset = true
		if r.Context().Err() != nil {
			// The client went away, and the upstream read failed with
			// it: the downstream reset came first (DC), not the
			// upstream's.
			e.Flags |= flagDC
		} else {
			e.Flags |= cutFlags(err)
		}
		p.cutEnd(e, ep)
		panic(http.ErrAbortHandler)
	default:
	}
	ep.close()
}

// endMessage is how the filter tells the processor the response ended: a
// body message with end_of_stream, or, when the response ends with
// trailers, the trailers (trailer mode SEND) or nothing at all (SKIP: the
// last data frame did not end the stream, the trailers did).
func endMessage(c *ExtProcConfig, up *response) *extprocv3.ProcessingRequest {
	if tr := up.trailers(); len(tr) > 0 {
		if c.ResponseTrailerMode != filterv3.ProcessingMode_SEND {
			return nil
		}
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: tr.proto()}}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}}
}

// trailers are the upstream's response trailers (once its body is at EOF).
func (up *response) trailers() headers {
	if up.trailer == nil {
		return nil
	}
	var out headers
	for k, vs := range up.trailer() {
		for _, v := range vs {
			out.add(strings.ToLower(k), v)
		}
	}
	return out
}

// writeTrailers passes the upstream's trailers on to the client.
func writeTrailers(w http.ResponseWriter, up *response) {
	for _, t := range up.trailers() {
		w.Header().Add(http.TrailerPrefix+t.k, t.v)
	}
}

func mustGet(h headers, k string) string {
	v, _ := h.get(k)
	return v
}

// format evaluates a header value: %DYNAMIC_METADATA(ns:key)% (a string
// field of the request's dynamic metadata, "" when absent), else the
// literal value.
func (e *Entry) format(v string) string {
	const pre, post = "%DYNAMIC_METADATA(", ")%"
	if !strings.HasPrefix(v, pre) || !strings.HasSuffix(v, post) {
		return v
	}
	ns, key, ok := strings.Cut(v[len(pre):len(v)-len(post)], ":")
	if !ok {
		return ""
	}
	return e.Metadata[ns].GetFields()[key].GetStringValue()
}

// cutFlags are the flags of a response a timer cut after its headers: the
// stream idle timer sets SI (conn_manager_impl.cc, onIdleTimeout), the
// route timeout UT (router.cc: onResponseTimeout → onUpstreamTimeoutAbort
// → onUpstreamAbort, which with the response started sets the flag and
// resets the stream); the entry keeps the upstream's status. The
// upstream's own reset sets UR, a client gone meanwhile DC.
func cutFlags(err error) uint64 {
	switch {
	case errors.Is(err, errStreamIdle):
		return flagSI
	case errors.Is(err, context.DeadlineExceeded):
		return flagUT
	case errors.Is(err, context.Canceled):
		return flagDC // the client went away while the upstream was read
	}
	// The upstream reset the answer (router.cc onUpstreamReset after the
	// response started: the reset reason's flag, UR for a remote reset).
	return flagUR
}

// finalizeResponse is the router's finalizing of the response headers (the
// virtual host's response_headers_to_add). A local reply the filter
// manager sends itself (a 413) has no route entry to finalize it.
func (p *Proxy) finalizeResponse(e *Entry, up *response, h *headers) {
	if up.beforeRouter {
		return
	}
	for _, a := range p.cfg.ResponseHeadersToAdd {
		if v := e.format(a.Value); v != "" {
			h.set(a.Key, v)
		}
	}
}

// responseHeadersPhase sends the response headers to ep's processor and
// applies its reply. It reports false when the request ended (answered
// here).
func (p *Proxy) responseHeadersPhase(w http.ResponseWriter, e *Entry, ep *epStream, up *response, hp *headers, noBody bool, streamed func() bool) bool {
	h := *hp
	defer func() { *hp = h }()
	if ep.active() && headerMode(ep.modes.ResponseHeaderMode, true) {
		if streamed() {
			h.del("content-length") // STREAMED mode removes it
		}
		resp, err := ep.exchange(&extprocv3.ProcessingRequest{
			Request:    &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: noBody}},
			Attributes: p.attributes(ep.c, up),
		})
		if err != nil {
			if !ep.fail(err) {
				p.writeLocal(w, e, p.errorReply(err))
				return false
			}
		} else {
			switch x := resp.Response.(type) {
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				p.writeImmediate(w, e, ep, x.ImmediateResponse, resp)
				return false
			case *extprocv3.ProcessingResponse_ResponseHeaders:
				cr := x.ResponseHeaders.GetResponse()
				if err := p.applyMutation(&h, cr.GetHeaderMutation(), true); err != nil {
					p.writeLocal(w, e, localReply(500, 0, "ext_proc_error", "ext_proc header mutation failed"))
					return false
				}
				if cr.GetClearRouteCache() {
					p.stats.add("clear_route_cache_ignored") // response path
				}
				p.keepMetadata(e, ep.c, resp)
				if resp.ModeOverride != nil && ep.c.AllowModeOverride {
					ep.modes = overrideModes(resp.ModeOverride, ep.c)
				}
				p.afterResponseHeaders(ep, noBody)
			default:
				p.stats.add("spurious_msgs_received")
				if !ep.fail(errSpurious) {
					p.writeLocal(w, e, localReply(500, 0, "ext_proc_error_spurious", "spurious ext_proc message"))
					return false
				}
			}
		}
	}
	return true
}

// cutEnd ends a response cut mid-answer: Envoy writes the access log entry
// as the downstream stream ends, then destroys the filters, so the route
// role's ext_proc stream is reset after its entry went out
// (conn_manager_impl.cc doDeferredStreamDestroy: log, then the filter
// manager's destroy). The attempt role's upstream filter is destroyed with
// its upstream request, before the downstream log.
func (p *Proxy) cutEnd(e *Entry, ep *epStream) {
	if ep.c == &p.cfg.ExtProc {
		p.record(e)
	}
	ep.reset()
}
