package grpcwire

import (
	"crypto/tls"
	"errors"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// Options are a Server's limits and settings; zero values take the
// defaults named on each field.
type Options struct {
	// Codec encodes and decodes every message (required).
	Codec encoding.CodecV2
	// MaxRecvMsgSize bounds one received message (4 MiB): a larger one
	// ends its stream with ResourceExhausted.
	MaxRecvMsgSize int
	// MaxConcurrentStreams is advertised to the peer in SETTINGS, and a
	// stream beyond it is refused (REFUSED_STREAM; unlimited).
	MaxConcurrentStreams uint32
	// StreamWindow and ConnWindow are the receive windows (256 KiB per
	// stream, 4 MiB per connection): static, fusebox's peer is a sidecar.
	StreamWindow, ConnWindow int32
	// TLS, when set, is the listener's TLS (it must offer ALPN h2).
	TLS *tls.Config
	// PingMinTime is the shortest interval between a peer's pings that is
	// not counted as abuse (10 s); after three strikes the connection is
	// closed with GOAWAY ENHANCE_YOUR_CALM, as grpc-go's enforcement does.
	PingMinTime time.Duration
	// KeepaliveTime: after this long without a frame from the peer, the
	// server pings it (1 min), and closes the connection if nothing comes
	// within KeepaliveTimeout (20 s).
	KeepaliveTime, KeepaliveTimeout time.Duration
	// MaxConnectionIdle closes a connection with no stream for this long
	// (5 min), with GOAWAY.
	MaxConnectionIdle time.Duration
	// OnAcceptError hears every accept error Serve backs off from (the
	// listener keeps accepting): descriptors or buffers ran out.
	OnAcceptError func(error)
	// WriteTimeout bounds one write to a connection's socket (10 s): a
	// peer that stops reading for that long has its connection closed.
	WriteTimeout time.Duration
	// MaxRecvMsgSizeFor bounds one received message of a method (full
	// name) below MaxRecvMsgSize, checked on the message's length prefix,
	// before a byte of it is buffered.
	MaxRecvMsgSizeFor map[string]int
	// MaxBufferedBytes bounds what the unfinished messages of every stream
	// may hold at once (256 MiB): each is charged its whole length when its
	// prefix arrives, and one that does not fit ends its stream with
	// ResourceExhausted.
	MaxBufferedBytes int64

	// inlineSlowCall overrides the slow inline call's bound (0: the
	// default, inline.go): a test of the inlining's order raises it, so
	// that a loaded machine's slow call does not end the inlining it
	// checks.
	inlineSlowCall time.Duration
}

func (o *Options) defaults() {
	if o.MaxRecvMsgSize <= 0 {
		o.MaxRecvMsgSize = 4 << 20
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = math.MaxUint32
	}
	if o.StreamWindow <= 0 {
		o.StreamWindow = 256 << 10
	}
	if o.ConnWindow < o.StreamWindow {
		o.ConnWindow = max(4<<20, o.StreamWindow)
	}
	if o.PingMinTime <= 0 {
		o.PingMinTime = 10 * time.Second
	}
	if o.KeepaliveTime <= 0 {
		o.KeepaliveTime = time.Minute
	}
	if o.KeepaliveTimeout <= 0 {
		o.KeepaliveTimeout = 20 * time.Second
	}
	if o.MaxBufferedBytes <= 0 {
		o.MaxBufferedBytes = 256 << 20
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.MaxConnectionIdle <= 0 {
		o.MaxConnectionIdle = 5 * time.Minute
	}
}

// BytesCodec is what a Codec may add to be called on plain byte slices
// (no mem.BufferSlice per message): extproc.Codec does.
type BytesCodec interface {
	// UnmarshalBytes decodes data into v and keeps no reference to data.
	UnmarshalBytes(data []byte, v any) error
	// AppendMarshal appends v's encoding to dst.
	AppendMarshal(dst []byte, v any) ([]byte, error)
}

// AliasingCodec is what a BytesCodec may add to decode without copying:
// when it reports aliased, the message it decoded may point into data
// until the stream's next receive (or its end), and the transport hands
// data's buffer to no one before then; otherwise the buffer goes back at
// once (a long-lived stream, such as an access log stream, must not hold
// its last message's buffer between messages). extproc.Codec aliases a
// body message's bytes: the route role's 8 KiB request body was a quarter
// of the bytes the observer profile allocated, copied out of a buffer the
// transport then reused. Its handlers keep nothing of a message past the
// next receive.
type AliasingCodec interface {
	UnmarshalBytesAliased(data []byte, v any) (aliased bool, err error)
}

// ErrServerStopped is Serve's error when the server was stopped before it.
var ErrServerStopped = errors.New("grpcwire: the server was stopped")

// method is one registered RPC.
type method struct {
	impl   any
	unary  grpc.MethodHandler // nil for a streaming method
	stream grpc.StreamHandler
	desc   grpc.StreamDesc
}

// Server serves registered gRPC services. It implements
// grpc.ServiceRegistrar, so generated Register functions take it.
type Server struct {
	opts       Options
	bytesCodec BytesCodec         // opts.Codec, if it is one
	aliasCodec AliasingCodec      // opts.Codec, if it is one
	methods    map[string]*method // by :path, "/pkg.Service/Method"
	// buffered: the bytes charged for every stream's unfinished message
	// (Options.MaxBufferedBytes).
	buffered atomic.Int64
	// inlineSlow: streams whose inlining ended on a slow call (inline.go).
	inlineSlow atomic.Int64

	mu      sync.Mutex
	lns     map[net.Listener]struct{}
	conns   map[*conn]struct{}
	stopped bool // Stop or GracefulStop was called
	connWG  sync.WaitGroup
	// handlers counts the handlers running. A connection the peer closed
	// ends at once, its handlers cancelled but maybe not yet returned;
	// Stop and GracefulStop wait for them too, so that what a handler
	// does last (record an outcome, end a span) happens before whatever
	// the caller stops next (the store's workers, the tracer).
	handlers sync.WaitGroup
}

// NewServer returns a Server with opts (Codec is required).
func NewServer(opts Options) *Server {
	if opts.Codec == nil {
		panic("grpcwire: Options.Codec is required")
	}
	opts.defaults()
	bc, _ := opts.Codec.(BytesCodec)
	ac, _ := opts.Codec.(AliasingCodec)
	return &Server{opts: opts, bytesCodec: bc, aliasCodec: ac, methods: map[string]*method{}, lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}}
}

// InlineHandoffs is the number of streams whose inline function took so
// long on the connection's reader that their messages were handed to
// their own goroutine from then on (SetInline).
func (s *Server) InlineHandoffs() int64 { return s.inlineSlow.Load() }

// RegisterService registers a service and its implementation; it must be
// called before Serve.
func (s *Server) RegisterService(sd *grpc.ServiceDesc, impl any) {
	for i := range sd.Methods {
		m := &sd.Methods[i]
		s.methods["/"+sd.ServiceName+"/"+m.MethodName] = &method{impl: impl, unary: m.Handler}
	}
	for i := range sd.Streams {
		d := sd.Streams[i]
		s.methods["/"+sd.ServiceName+"/"+d.StreamName] = &method{impl: impl, stream: d.Handler, desc: d}
	}
}

// Serve accepts connections on ln until ln fails or the server stops; it
// returns nil after Stop or GracefulStop.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		ln.Close()
		return ErrServerStopped
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			stopped := s.stopped
			s.mu.Unlock()
			if stopped {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Anything else is the machine's, for now: descriptors run out
			// (EMFILE, ENFILE), buffers (ENOBUFS), a connection aborted
			// before it was taken. Back off and accept again, as grpc-go
			// and net/http do; the connections already served go on.
			// Before, only a timeout was retried, and 20,000 idle
			// connections (the default descriptor limit) ended the process.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if s.opts.OnAcceptError != nil {
				s.opts.OnAcceptError(err)
			}
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		c := newConn(s, nc)
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// stopListening closes the listeners and returns the connections.
func (s *Server) stopListening() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for ln := range s.lns {
		ln.Close()
	}
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	return cs
}

// Stop closes the listeners and every connection at once: the streams'
// contexts are cancelled. It returns when their handlers have (as
// grpc-go's with WaitForHandlers).
func (s *Server) Stop() {
	for _, c := range s.stopListening() {
		c.close(errors.New("the server stopped"))
	}
	s.connWG.Wait()
	// Every handler was started by a connection's reader, which is done:
	// nothing adds to handlers now.
	s.handlers.Wait()
}

// GracefulStop closes the listeners, tells every connection to open no
// new stream (GOAWAY), and waits for the open streams to end and their
// handlers to return. Before, a connection its peer had closed counted
// as done with its handlers still running: a span they ended after the
// tracer's shutdown was lost (e2e TestARequestsTraceShowsTheDecision,
// loaded), and so could an outcome recorded after the store's workers
// stopped.
func (s *Server) GracefulStop() {
	for _, c := range s.stopListening() {
		c.drain()
	}
	s.connWG.Wait()
	s.handlers.Wait()
}
