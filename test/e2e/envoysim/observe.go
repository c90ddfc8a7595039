package envoysim

import (
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Observability mode (docs/envoy.md, "Observability mode"), as Envoy's
// ext_proc filter plays it:
//
//   - headers, STREAMED body chunks and trailers are sent with
//     observability_mode set and the filter returns Continue at once: no
//     chunk waits for a reply, and no message timer runs;
//   - every reply is read and ignored (Filter::onReceiveMessage);
//   - protocol_config is never sent; metadata_context carries the
//     forwarding namespaces' dynamic metadata on every message;
//   - sends go to the side stream's buffer; above its high watermark the
//     main stream is paused (the side stream's watermark callbacks raise
//     the encoder's), so a server that stops reading slows the response
//     once the buffer is full, and memory stays bounded;
//   - when the HTTP stream is destroyed the side stream is closed after
//     deferred_close_timeout (5 s by default);
//   - on 1.34–1.36 a local reply is not sent (processing complete), as for
//     the synchronous filter.

// highWatermark is the side stream's buffer before Envoy pauses the main
// stream: the HTTP/2 codec's per-stream send buffer limit, which is the
// ext_proc cluster's http2_protocol_options.initial_stream_window_size
// (codec_impl.cc: per_stream_buffer_limit_), so the file decides it; unset,
// it is the release's default (version.go, StreamWindowDefault).
func (o *obsStream) highWatermark() int { return o.p.cfg.streamWindow(o.p.cfg.Observer) }

// streamWindow is filter f's cluster's initial_stream_window_size: the
// file's, or the release's default.
func (c *Config) streamWindow(f *ExtProcConfig) int {
	if f.StreamWindow > 0 {
		return f.StreamWindow
	}
	return c.Envoy.StreamWindowDefault()
}

// obsStream is the observer filter's stream for one request.
type obsStream struct {
	p  *Proxy
	ep *epStream
	e  *Entry

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*extprocv3.ProcessingRequest
	buffered int // bytes queued, not yet handed to gRPC
	closing  bool
	done     chan struct{}
	ended    sync.Once // the stream is over: the server ended it, or the deferred close
	over     chan struct{}
	reqID    string
}

// newObserver opens the observer's stream for e; nil without an observer.
func (p *Proxy) newObserver(e *Entry, reqID string) *obsStream {
	if p.cfg.Observer == nil || p.cfg.Observer.Addr == "" {
		return nil
	}
	o := &obsStream{p: p, ep: newEPStreamFor(p, p.cfg.Observer), e: e, done: make(chan struct{}), over: make(chan struct{}), reqID: reqID}
	o.ep.first = false // observability mode sends no protocol_config
	o.ep.traceCtx = e.traceCtx
	o.cond = sync.NewCond(&o.mu)
	p.obsOpen.Add(1)
	p.obsMu.Lock()
	if p.obsByReq == nil {
		p.obsByReq = map[string]*obsStream{}
	}
	p.obsByReq[reqID] = o
	p.obsMu.Unlock()
	go o.run()
	return o
}

func (o *obsStream) end() {
	o.ended.Do(func() {
		o.p.obsOpen.Add(-1)
		close(o.over)
		o.p.obsMu.Lock()
		delete(o.p.obsByReq, o.reqID)
		o.p.obsMu.Unlock()
	})
}

// RequestHeader is the response header (envoysim's own, not Envoy's)
// naming the request (its Entry.RequestID) on every response, so that a
// test can wait for its observer and find its access log entry.
const RequestHeader = "x-envoysim-request"

// WaitObserver waits until the observer stream of request id (the
// RequestHeader of its response) is over: the server ended it after
// recording, or it was closed; at most d. The observer records a response
// after the client has it, so a test that reads fusebox's state right after
// a response waits here first. It reports false on the timeout.
func (p *Proxy) WaitObserver(id string, d time.Duration) bool {
	p.obsMu.Lock()
	o := p.obsByReq[id]
	p.obsMu.Unlock()
	if o == nil {
		return true
	}
	select {
	case <-o.over:
		return true
	case <-time.After(d):
		return false
	}
}

// run hands queued messages to gRPC in order and drops every reply.
func (o *obsStream) run() {
	defer close(o.done)
	draining := false
	for {
		o.mu.Lock()
		for len(o.queue) == 0 && !o.closing {
			o.cond.Wait()
		}
		if len(o.queue) == 0 {
			o.mu.Unlock()
			break
		}
		req := o.queue[0]
		o.queue = o.queue[1:]
		o.mu.Unlock()
		err := o.ep.send(req)
		o.mu.Lock()
		o.buffered -= size(req)
		o.cond.Broadcast()
		o.mu.Unlock()
		if err != nil {
			// The side stream failed (fusebox down, the stream reset): the
			// filter's stream is gone and the response goes on without it.
			// It is over now — a test waiting for its record waits no
			// longer (before, it waited out the deferred close, 5 s).
			o.p.stats.add("observer_send_errors")
			o.end()
			continue
		}
		if !draining && o.ep.replies != nil {
			draining = true
			go o.ignoreReplies(o.ep.replies)
		}
	}
	o.drain()
}

// ignoreReplies reads and drops every reply, as the filter does.
func (o *obsStream) ignoreReplies(ch chan recvd) {
	for r := range ch {
		if r.err != nil {
			o.end()
			return
		}
		o.p.stats.add("observer_replies_ignored")
	}
}

// drain closes the stream the way the filter's deferred close does.
func (o *obsStream) drain() {
	d := o.p.cfg.Observer.DeferredClose
	if d <= 0 {
		d = 5 * time.Second
	}
	go func() {
		// A stream the server already ended holds nothing more: the
		// filter's deferred close only bounds one the server leaves open.
		// (Before, every stream kept a goroutine for the full 5 s, and the
		// observer soak's baseline held 2,000 of them.)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-o.over:
		case <-t.C:
		}
		o.ep.reset()
		o.end()
	}()
}

// ObserversOpen is how many observer streams are not over yet.
func (p *Proxy) ObserversOpen() int64 { return p.obsOpen.Load() }

func size(r *extprocv3.ProcessingRequest) int {
	if b := r.GetResponseBody(); b != nil {
		return len(b.Body) + 16
	}
	return 256
}

// send queues one message without waiting for anything but room in the
// side stream's buffer (Envoy's watermark: above it the response pauses).
func (o *obsStream) send(req *extprocv3.ProcessingRequest) {
	req.ObservabilityMode = true
	req.MetadataContext = o.metadata()
	n := size(req)
	high := o.highWatermark()
	o.mu.Lock()
	if o.buffered+n > high && o.buffered > 0 {
		o.p.stats.add("observer_high_watermark")
		for o.buffered+n > high/2 && o.buffered > 0 {
			o.cond.Wait()
		}
	}
	o.queue = append(o.queue, req)
	o.buffered += n
	o.cond.Broadcast()
	o.mu.Unlock()
}

// metadata is the forwarding namespaces' dynamic metadata now.
func (o *obsStream) metadata() *corev3.Metadata {
	md := &corev3.Metadata{}
	for _, ns := range o.p.cfg.Observer.ForwardingNamespaces {
		// Set by the route role's request-path replies, before the
		// response: read only from here on.
		if v := o.e.Metadata[ns]; v != nil {
			if md.FilterMetadata == nil {
				md.FilterMetadata = map[string]*structpb.Struct{}
			}
			md.FilterMetadata[ns] = v
		}
	}
	return md
}

func (o *obsStream) headers(h headers, eos bool, up *response) {
	o.send(&extprocv3.ProcessingRequest{
		Request:    &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: eos}},
		Attributes: o.p.attributes(o.p.cfg.Observer, up),
	})
	if eos {
		o.close()
	}
}

func (o *obsStream) body(chunk []byte, eos bool) {
	o.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}}})
	if eos {
		o.close()
	}
}

// finish: the response is over. Its end goes to the observer as the filter
// sends it (endMessage: a body end, the trailers, or nothing in trailer
// mode SKIP), then the stream closes.
func (o *obsStream) finish(up *response) {
	if o == nil {
		return
	}
	if msg := endMessage(o.p.cfg.Observer, up); msg != nil {
		o.send(msg)
	} else {
		o.p.stats.add("body_end_not_sent")
	}
	o.close()
}

// close: the HTTP stream is done (its end, a reset); what is queued still
// goes out, then the deferred close.
func (o *obsStream) close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.closing = true
	o.cond.Broadcast()
	o.mu.Unlock()
}
