package envoysim

import (
	"errors"
	"io"
	"net/http"
	"strconv"
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
// forwarded once its own reply arrives), then ends the ext_proc stream.
func (p *Proxy) respond(w http.ResponseWriter, r *http.Request, e *Entry, ep *epStream, up *response) {
	streamed := func() bool { return ep.active() && ep.modes.ResponseBodyMode == filterv3.ProcessingMode_STREAMED }
	h := headers{{":status", strconv.Itoa(up.status)}}
	h = append(h, up.hdr...)
	noBody := r.Method == http.MethodHead
	if cl, ok := up.hdr.get("content-length"); ok && cl == "0" {
		noBody = true
	}
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
				return
			}
		} else {
			switch x := resp.Response.(type) {
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				p.writeImmediate(w, e, ep, x.ImmediateResponse, resp)
				return
			case *extprocv3.ProcessingResponse_ResponseHeaders:
				cr := x.ResponseHeaders.GetResponse()
				if err := p.applyMutation(&h, cr.GetHeaderMutation(), true); err != nil {
					p.writeLocal(w, e, localReply(500, 0, "ext_proc_error", "ext_proc header mutation failed"))
					return
				}
				if cr.GetClearRouteCache() {
					p.stats.add("clear_route_cache_ignored") // response path
				}
				p.keepMetadata(e, resp)
				if resp.ModeOverride != nil && ep.c.AllowModeOverride {
					ep.modes = overrideModes(resp.ModeOverride)
				}
			default:
				p.stats.add("spurious_msgs_received")
				if !ep.fail(errSpurious) {
					p.writeLocal(w, e, localReply(500, 0, "ext_proc_error_spurious", "spurious ext_proc message"))
					return
				}
			}
		}
	}
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
		ep.close()
		if _, err := io.Copy(flushWriter{w, flush}, up.body); err != nil && !errors.Is(err, io.EOF) {
			e.Reset = true
			panic(http.ErrAbortHandler) // upstream reset after headers: reset downstream
		}
		return
	}

	// STREAMED: the reader sends each chunk as it arrives without waiting;
	// this goroutine forwards chunk i once reply i arrives.
	type sent struct {
		chunk []byte
		at    time.Time
		eos   bool
	}
	queue := make(chan sent, 256)
	upErr := make(chan error, 1)
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
					}
				}
				queue <- s
			}
			if err == io.EOF {
				s := sent{at: time.Now(), eos: true}
				if ep.active() {
					_ = ep.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}})
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
		if processing && ep.active() && !s.at.IsZero() {
			resp, err := ep.next(s.at)
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
				p.keepMetadata(e, resp)
			} else {
				p.stats.add("spurious_msgs_received")
				if !ep.fail(errSpurious) {
					e.Reset = true
					panic(http.ErrAbortHandler)
				}
				processing = false
			}
		}
		if len(out) > 0 {
			if _, err := w.Write(out); err != nil {
				// The client went away: Envoy resets the ext_proc stream.
				ep.reset()
				e.Reset = true
				return
			}
			flush()
		}
		if r.Context().Err() != nil {
			ep.reset()
			e.Reset = true
			return
		}
	}
	select {
	case <-upErr:
		// Upstream reset after headers: the downstream stream is reset
		// and the processor sees no end_of_stream.
		ep.reset()
		e.Reset = true
		panic(http.ErrAbortHandler)
	default:
	}
	ep.close()
}

func mustGet(h headers, k string) string {
	v, _ := h.get(k)
	return v
}

type flushWriter struct {
	w     io.Writer
	flush func()
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	f.flush()
	return n, err
}
