package envoysim

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

var errMessageTimeout = errors.New("ext_proc message timeout")

// errAttemptReset: the router reset the upstream request while its
// filters were still in their request phase (a fast connect failure: the
// connection is dialled before the upstream filters run). Nothing is
// answered: the attempt is retried or ends as a connect failure.
var errAttemptReset = errors.New("upstream request reset during its filters")

// epStream is the ext_proc filter's stream for one request.
type epStream struct {
	// traceCtx: the request's span (tracing.go); traceSpan: this
	// stream's client span, ended with the stream.
	traceCtx  context.Context
	traceSpan trace.Span
	p         *Proxy
	c         *ExtProcConfig // the filter's settings (the route role's, or an upstream attempt role's)
	modes     modes
	ctx       context.Context
	cancel    context.CancelFunc
	s         extprocv3.ExternalProcessor_ProcessClient
	first     bool
	// failed: processing stopped (an error or timeout with
	// failure_mode_allow); the request continues unprocessed.
	failed  atomic.Bool
	replies chan recvd
	closed  atomic.Bool
	// cutc is closed by cut: the upstream request was reset under the
	// filter (failover.go).
	cutc    chan struct{}
	cutOnce sync.Once
	// sent is closed once a first message went out: Envoy's filter sends
	// its headers within the call that dialled, before any connect
	// failure can be seen (a later event loop iteration).
	sent     chan struct{}
	sentOnce sync.Once
	// sendMu serialises Send and CloseSend, which gRPC forbids running
	// concurrently (the body reader sends while the forwarder may close).
	sendMu sync.Mutex
	// entry is the request's access log entry (timeouts.go), lastSent the
	// phase of the last message sent, timeout its stream's timeout event.
	entry    *Entry
	lastSent string
	lastEOS  bool
	timeout  *TimeoutEvent
}

type recvd struct {
	resp *extprocv3.ProcessingResponse
	err  error
}

func newEPStream(p *Proxy) *epStream { return newEPStreamFor(p, &p.cfg.ExtProc) }

// newEPStreamFor is the stream of an ext_proc filter configured by c: the
// route role's, or (failover) the attempt role's in a cluster's upstream
// chain, a new stream per attempt.
func newEPStreamFor(p *Proxy, c *ExtProcConfig) *epStream {
	return &epStream{p: p, c: c, first: true, cutc: make(chan struct{}), sent: make(chan struct{}), modes: modes{
		RequestHeaderMode:  c.RequestHeaderMode,
		ResponseHeaderMode: c.ResponseHeaderMode,
		RequestBodyMode:    c.RequestBodyMode,
		ResponseBodyMode:   c.ResponseBodyMode,
	}}
}

// modes are the processing modes in force for one stream.
type modes struct {
	RequestHeaderMode, ResponseHeaderMode filterv3.ProcessingMode_HeaderSendMode
	RequestBodyMode, ResponseBodyMode     filterv3.ProcessingMode_BodySendMode
}

// active reports whether the filter still talks to the server.
func (e *epStream) active() bool {
	return e.c.Addr != "" && !e.failed.Load() && !e.closed.Load()
}

func headerMode(m filterv3.ProcessingMode_HeaderSendMode, def bool) bool {
	switch m {
	case filterv3.ProcessingMode_SEND:
		return true
	case filterv3.ProcessingMode_SKIP:
		return false
	}
	return def
}

// open starts the gRPC stream lazily, on the first message (docs/ext_proc.md).
func (e *epStream) open() error {
	if e.s != nil {
		return nil
	}
	e.p.stats.add("streams_started")
	md := metadata.New(nil)
	for k, v := range e.c.InitialMetadata {
		md.Set(k, v)
	}
	if e.p.tracer != nil && e.traceCtx != nil {
		e.traceSpan = e.p.tracer.extProcSpan(e.traceCtx, md)
	}
	e.ctx, e.cancel = context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
	s, err := extprocv3.NewExternalProcessorClient(e.p.epClusters[e.c].pick()).Process(e.ctx)
	if err != nil {
		return err
	}
	e.s = s
	e.replies = make(chan recvd, 64)
	go func() {
		for {
			r, err := s.Recv()
			e.replies <- recvd{r, err}
			if err != nil {
				return
			}
		}
	}()
	return nil
}

// send sends one message; the first carries protocol_config (1.34+) and
// an (empty) metadata_context, as Envoy does.
func (e *epStream) send(req *extprocv3.ProcessingRequest) error {
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	if e.closed.Load() {
		return errors.New("ext_proc stream closed")
	}
	if err := e.open(); err != nil {
		return err
	}
	if e.first {
		if e.p.cfg.Envoy.SendsProtocolConfig() {
			req.ProtocolConfig = &extprocv3.ProtocolConfiguration{
				RequestBodyMode:  e.c.RequestBodyMode,
				ResponseBodyMode: e.c.ResponseBodyMode,
			}
		}
		req.MetadataContext = &corev3.Metadata{}
		e.first = false
	}
	e.p.stats.add("stream_msgs_sent")
	e.lastSent, e.lastEOS = phaseOf(req), endOf(req)
	err := e.s.Send(req)
	e.sentOnce.Do(func() { close(e.sent) })
	return err
}

// next waits for the next reply, at most the message timeout from since.
func (e *epStream) next(since time.Time) (*extprocv3.ProcessingResponse, error) {
	wait := time.Until(since.Add(e.c.MessageTimeout))
	if wait < 0 {
		wait = 0
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case r := <-e.replies:
		return e.got(r)
	case <-t.C:
		e.p.stats.add("message_timeouts")
		return nil, errMessageTimeout
	case <-e.cutc:
		return nil, errAttemptReset
	}
}

// got is one reply off the stream: a message, or how the stream ended
// (io.EOF: the server closed it with OK, and Envoy continues without
// further processing).
func (e *epStream) got(r recvd) (*extprocv3.ProcessingResponse, error) {
	if r.err != nil {
		if errors.Is(r.err, io.EOF) {
			return nil, io.EOF
		}
		return nil, r.err
	}
	e.p.stats.add("stream_msgs_received")
	return r.resp, nil
}

// dirTimer is the filter's message timer for one direction in STREAMED
// mode (processor_state.cc: one message_timer_ per direction;
// onStartProcessorCall re-arms it for every chunk sent, onFinishProcessorCall
// disables it at every reply): a reply's deadline is the last send's, and
// after a reply no deadline runs until the next chunk is sent.
type dirTimer struct {
	timeout  time.Duration
	mu       sync.Mutex
	armed    bool
	deadline time.Time
	changed  chan struct{}
}

func newDirTimer(timeout time.Duration) *dirTimer {
	return &dirTimer{timeout: timeout, changed: make(chan struct{}, 1)}
}

// arm restarts the timer: a message was sent at at.
func (d *dirTimer) arm(at time.Time) {
	d.mu.Lock()
	d.armed, d.deadline = true, at.Add(d.timeout)
	d.mu.Unlock()
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

func (d *dirTimer) stop() {
	d.mu.Lock()
	d.armed = false
	d.mu.Unlock()
}

func (d *dirTimer) state() (bool, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.armed, d.deadline
}

// nextOn waits for the next reply under the direction's timer.
func (e *epStream) nextOn(d *dirTimer) (*extprocv3.ProcessingResponse, error) {
	for {
		armed, deadline := d.state()
		var fire <-chan time.Time
		var t *time.Timer
		if armed {
			t = time.NewTimer(max(time.Until(deadline), 0))
			fire = t.C
		}
		select {
		case r := <-e.replies:
			if t != nil {
				t.Stop()
			}
			d.stop()
			return e.got(r)
		case <-fire:
			e.p.stats.add("message_timeouts")
			return nil, errMessageTimeout
		case <-d.changed:
			if t != nil {
				t.Stop()
			}
		}
	}
}

// exchange sends req and waits for its reply.
func (e *epStream) exchange(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	t0 := time.Now()
	if err := e.send(req); err != nil {
		if e.wasCut() {
			return nil, errAttemptReset
		}
		return nil, err
	}
	return e.next(t0)
}

// fail handles an error talking to the server: with failure_mode_allow the
// request continues unprocessed (and the stream is closed); otherwise the
// caller sends status_on_error (500) or, on a message timeout, 504.
func (e *epStream) fail(err error) (allowed bool) {
	e.p.stats.add("streams_failed")
	e.failed.Store(true)
	if errors.Is(err, errMessageTimeout) {
		e.sendMu.Lock()
		e.timedOut()
		e.sendMu.Unlock()
	}
	e.close()
	if errors.Is(err, io.EOF) {
		return true // closed with OK: continue without processing
	}
	if e.c.FailureModeAllow {
		e.p.stats.add("failure_mode_allowed")
		return true
	}
	return false
}

// close ends the stream the way Envoy does: a half-close, then a reset,
// at once unless the graceful close guard is on (streamclose.go).
func (e *epStream) close() {
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	if e.traceSpan != nil {
		e.traceSpan.End()
		e.traceSpan = nil
	}
	if e.closed.Swap(true) || e.s == nil {
		return
	}
	_ = e.s.CloseSend()
	wait, graceful := e.p.gracefulClose()
	if !graceful {
		// ExternalProcessorStreamImpl::close: the half-close is followed
		// at once by a reset; a reply still on its way is never read.
		e.cancel()
		return
	}
	go func(cancel context.CancelFunc, replies chan recvd) {
		t := time.NewTimer(wait)
		defer t.Stop()
		for {
			select {
			case r := <-replies:
				if r.err != nil {
					cancel()
					return
				}
				e.lateReply(r.resp)
			case <-t.C:
				cancel()
				return
			}
		}
	}(e.cancel, e.replies)
}

// cut resets the stream because its upstream request was reset: a phase
// waiting for a reply gives up at once, with errAttemptReset.
func (e *epStream) cut() {
	e.cutOnce.Do(func() {
		close(e.cutc)
		e.reset()
	})
}

// wasCut reports whether cut ran.
func (e *epStream) wasCut() bool {
	select {
	case <-e.cutc:
		return true
	default:
		return false
	}
}

// reset ends the stream abruptly (the client went away): half-close and
// reset at once.
func (e *epStream) reset() {
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	if e.s != nil && !e.closed.Swap(true) {
		_ = e.s.CloseSend()
		e.cancel()
	}
	e.closed.Store(true)
}
