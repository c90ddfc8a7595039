package grpcwire

import (
	"context"
	"sync"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// stream is one gRPC call; it implements grpc.ServerStream for the
// service's handler, which runs on its own goroutine.
type stream struct {
	c      *conn
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc
	method string

	// Guarded by c.mu: the peer's window for our DATA on this stream.
	sendWindow int64

	// Receive side, guarded by mu. pending is an incomplete message's
	// bytes; msgs the complete ones not yet taken (msgs[head:]); queued
	// their size; owed the bytes received and not yet returned to the
	// peer's window; recvErr what Recv returns once msgs is empty (io.EOF
	// after the peer's END_STREAM).
	mu      sync.Mutex
	pending []byte
	// charged: the bytes of the unfinished message charged to the server's
	// buffer budget (Options.MaxBufferedBytes); maxRecv: the bound of one
	// message of this stream's method.
	charged  int64
	maxRecv  int
	msgs     [][]byte
	head     int
	queued   int
	owed     int32
	recvErr  error
	halfDone bool // the peer ended its side
	failed   bool // a message could not be read: the rest is dropped
	moved    int  // bytes deframe moved within pending (a test holds it linear)
	reset    bool // RST_STREAM sent or received: write nothing more
	signal   chan struct{}
	// inline is the handler's inline function (SetInline), and waiting
	// says the handler waits in take with nothing queued: only then may
	// the reader call it, st.mu held, so that the messages are handled
	// in order and never while the handler runs.
	inline  func([]byte) bool
	waiting bool

	// Send side, guarded by smu: the handler's goroutine sends, and the
	// transport's finishes the stream, which may be at the same time when
	// a handler hands its stream to another goroutine and returns (the
	// processor's lifetime watch does).
	// held is the buffer of the last message received, which it may
	// point into (AliasingCodec): the handler's goroutine's alone.
	held []byte

	smu        sync.Mutex
	headerSent bool
	header     metadata.MD
	trailer    metadata.MD
	wbuf       []byte
}

// run calls the method's handler and ends the stream with its status.
func (st *stream) run(m *method) {
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = status.Errorf(codes.Internal, "the handler panicked: %v", r)
			}
		}()
		if m.unary != nil {
			var resp any
			resp, err = m.unary(m.impl, st.ctx, st.RecvMsg, nil)
			if err == nil {
				err = st.SendMsg(resp)
			}
			return
		}
		err = m.stream(m.impl, st)
	}()
	st.finish(err)
	st.cancel()
	st.release()
	st.c.streamEnded(st)
}

// release returns the queued buffers, and the last received message's
// (the handler has returned).
func (st *stream) release() {
	if st.held != nil {
		putBuf(st.held)
		st.held = nil
	}
	st.mu.Lock()
	for i := st.head; i < len(st.msgs); i++ {
		putBuf(st.msgs[i])
	}
	st.msgs, st.head, st.pending = nil, 0, nil
	st.inline = nil
	st.mu.Unlock()
}

func (st *stream) wake() {
	select {
	case st.signal <- struct{}{}:
	default:
	}
}

// abort ends the stream's receive side with cause and cancels its
// context; with rst it also resets the stream with code (the handler's
// status is then not sent).
func (st *stream) abort(cause error, rst bool, code http2.ErrCode) {
	st.mu.Lock()
	already := st.reset
	st.reset = true
	st.recvErr = cause
	st.halfDone = true
	st.mu.Unlock()
	st.cancel()
	st.wake()
	st.c.mu.Lock()
	st.c.cond.Broadcast()
	st.c.mu.Unlock()
	if rst && !already {
		_ = st.c.write(func() error { return st.c.fr.WriteRSTStream(st.id, code) })
	}
}

// Context, SetHeader, SendHeader, SetTrailer, SendMsg, RecvMsg:
// grpc.ServerStream.
func (st *stream) Context() context.Context { return st.ctx }

func (st *stream) SetHeader(md metadata.MD) error {
	st.smu.Lock()
	defer st.smu.Unlock()
	return st.setHeader(md)
}

func (st *stream) setHeader(md metadata.MD) error {
	if st.headerSent {
		return status.Error(codes.Internal, "grpc: headers already sent")
	}
	st.header = metadata.Join(st.header, md)
	return nil
}

func (st *stream) SendHeader(md metadata.MD) error {
	st.smu.Lock()
	defer st.smu.Unlock()
	if err := st.setHeader(md); err != nil {
		return err
	}
	return st.sendHeader()
}

func (st *stream) SetTrailer(md metadata.MD) {
	st.smu.Lock()
	st.trailer = metadata.Join(st.trailer, md)
	st.smu.Unlock()
}

func (st *stream) isReset() bool {
	st.mu.Lock()
	r := st.reset
	st.mu.Unlock()
	return r
}
