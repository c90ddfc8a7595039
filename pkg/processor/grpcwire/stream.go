package grpcwire

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
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

// Received messages' buffers, pooled by size class (a pool of mixed
// sizes handed an 8 KiB message a 1 KiB buffer, dropped it, and made a
// new one).
var bufClasses = [...]int{1 << 10, 4 << 10, 16 << 10, 64 << 10}

var bufPools [len(bufClasses)]sync.Pool

// A pool holds each buffer as the pointer to its first byte: a pointer
// goes into an interface without an allocation, where a slice (or the
// address of a local slice header, as before) cost one per put, a
// million objects in a 10 s observer profile. The class gives the length
// back.
func getBuf(n int) []byte {
	for i, c := range bufClasses {
		if n <= c {
			if p, ok := bufPools[i].Get().(*byte); ok {
				return unsafe.Slice(p, c)[:n]
			}
			return make([]byte, n, c)
		}
	}
	return make([]byte, n)
}

func putBuf(b []byte) {
	if poisonBuffers {
		poison(b[:cap(b)])
	}
	for i, c := range bufClasses {
		if cap(b) == c {
			bufPools[i].Put(unsafe.SliceData(b[:c]))
			return
		}
	}
}

// poison overwrites b (the poison build, poison_on.go).
func poison(b []byte) {
	for i := range b {
		b[i] = 0xdb
	}
}

// maxMetadataBytes bounds the metadata one stream keeps (names and values).
const maxMetadataBytes = 16 << 10

// onHeaders opens a stream, or ends the peer's side of one (trailers).
func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		c.mu.Unlock()
		if !f.StreamEnded() {
			c.resetStream(id, http2.ErrCodeProtocol, status.Error(codes.Internal, "trailers without END_STREAM"))
			return nil
		}
		st.mu.Lock()
		st.halfDone = true
		if st.recvErr == nil {
			st.recvErr = io.EOF
		}
		st.mu.Unlock()
		st.wake()
		return nil
	}
	if id%2 == 0 || id <= c.lastID {
		c.mu.Unlock()
		return errConn{http2.ErrCodeProtocol, fmt.Sprintf("HEADERS on stream %d (last %d)", id, c.lastID)}
	}
	c.lastID = id
	refused := id > c.maxID || c.closed || uint32(len(c.streams)) >= c.srv.opts.MaxConcurrentStreams
	c.mu.Unlock()
	if refused {
		return c.write(func() error { return c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
	}
	if f.Truncated {
		return c.answer(id, 431, nil)
	}
	var path, method, ctype, timeout string
	var md metadata.MD
	mdBytes := 0
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":path":
			path = hf.Value
		case ":method":
			method = hf.Value
		case "content-type":
			ctype = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			if hf.Value != "identity" {
				return c.answer(id, 200, status.New(codes.Unimplemented, "grpc: compression is not supported"))
			}
		case "te", "grpc-accept-encoding", "grpc-message-type", "grpc-status", "grpc-message", "grpc-status-details-bin":
		default:
			if len(hf.Name) > 0 && hf.Name[0] == ':' {
				continue
			}
			if strings.HasSuffix(hf.Name, "-bin") {
				// Binary metadata: nothing fusebox serves reads it, and each
				// reference to one HPACK table entry decoded and kept for
				// the stream's life amplified a small header block about
				// 2,000 times (#50: 200 streams, 256 MB). Not decoded.
				continue
			}
			if mdBytes += len(hf.Name) + len(hf.Value); mdBytes > maxMetadataBytes {
				// What a stream keeps of its metadata is bounded too (the
				// same amplification with text values); the rest is
				// dropped: fusebox reads one short key (its role).
				continue
			}
			if md == nil {
				md = metadata.MD{}
			}
			v, err := decodeMetadataValue(hf.Name, hf.Value)
			if err != nil {
				return c.answer(id, 200, status.New(codes.Internal, err.Error()))
			}
			md[hf.Name] = append(md[hf.Name], v)
		}
	}
	if method != "POST" {
		return c.answer(id, 415, nil)
	}
	if !isGRPCContentType(ctype) {
		// As grpc-go answers it: the HTTP status, and a gRPC one that says
		// why (the differential test).
		return c.answer(id, 415, status.Newf(codes.InvalidArgument, "invalid gRPC request content-type %q", ctype))
	}
	m := c.srv.methods[path]
	if m == nil {
		return c.answer(id, 200, status.Newf(codes.Unimplemented, "unknown method %s", path))
	}
	ctx := c.ctx
	var cancel context.CancelFunc
	if timeout != "" {
		d, err := parseTimeout(timeout)
		if err != nil {
			// 400 as grpc-go answers a malformed request header.
			return c.answer(id, 400, status.New(codes.Internal, err.Error()))
		}
		ctx, cancel = context.WithTimeout(ctx, d)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	if md != nil {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	st := &stream{c: c, id: id, cancel: cancel, method: path, signal: make(chan struct{}, 1), maxRecv: c.srv.opts.MaxRecvMsgSize}
	if m, ok := c.srv.opts.MaxRecvMsgSizeFor[path]; ok && m > 0 {
		st.maxRecv = min(m, st.maxRecv)
	}
	st.ctx = context.WithValue(ctx, streamKey{}, st) // EndFunc
	if timeout != "" {
		// The deadline wakes a receive that waits (take waits on the
		// stream's signal alone), and a send that waits for window.
		context.AfterFunc(ctx, func() {
			st.wake()
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
	}
	if f.StreamEnded() {
		st.halfDone, st.recvErr = true, io.EOF
	}
	c.mu.Lock()
	st.sendWindow = int64(c.peerWindow)
	c.streams[id] = st
	c.mu.Unlock()
	Go(func() { st.run(m) }) // a reused goroutine (Workers)
	c.woke = true
	return nil
}

func isGRPCContentType(ct string) bool {
	const p = "application/grpc"
	return len(ct) >= len(p) && ct[:len(p)] == p && (len(ct) == len(p) || ct[len(p)] == '+' || ct[len(p)] == ';')
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

// onData appends a DATA frame's payload (length n with padding) and
// queues the messages it completes. Called by the connection's reader.
func (st *stream) onData(p []byte, n int32, end bool) error {
	c := st.c
	st.mu.Lock()
	if st.halfDone && !st.failed {
		st.mu.Unlock()
		c.resetStream(st.id, http2.ErrCodeStreamClosed, status.Error(codes.Internal, "DATA after END_STREAM"))
		return nil
	}
	st.owed += n
	if st.owed > c.srv.opts.StreamWindow {
		st.mu.Unlock()
		c.resetStream(st.id, http2.ErrCodeFlowControl, status.Error(codes.Internal, "the peer overran the stream window"))
		return nil
	}
	queued := false
	if !st.failed {
		queued = st.deframe(p) || st.failed
	}
	if end && !st.halfDone {
		st.halfDone = true
		if st.recvErr == nil {
			st.recvErr = io.EOF
			if len(st.pending) > 0 {
				st.recvErr = status.Error(codes.Internal, "the stream ended inside a message")
			}
		}
	}
	inc := st.credit()
	st.mu.Unlock()
	if queued || end {
		st.wake()
		c.woke = true
	}
	return st.returnWindow(inc)
}

// deframe queues the complete messages of pending+p and keeps the rest in
// pending. A message that is compressed or too large fails the receive
// side: Recv returns its status once the messages before it are taken,
// the handler's status goes out as usual, and what follows is dropped.
// st.mu is held.
func (st *stream) deframe(p []byte) (queued bool) {
	src := p
	if len(st.pending) > 0 {
		st.pending = append(st.pending, p...)
		src = st.pending
	}
	max := st.maxRecv
	for len(src) >= 5 {
		if src[0] != 0 {
			st.fail(status.Error(codes.Unimplemented, "grpc: a compressed message, and compression is not supported"))
			return queued
		}
		size := int(be32(src[1:5]))
		if size > max {
			st.fail(status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", size, max))
			return queued
		}
		if len(src) < 5+size {
			break
		}
		if st.inline != nil && st.waiting && st.head == len(st.msgs) && st.offerInline(src[5:5+size]) {
			src = src[5+size:] // handled: nothing queued, nothing to wake
			continue
		}
		b := getBuf(size)
		copy(b, src[5:5+size])
		st.msgs = append(st.msgs, b)
		st.queued += 5 + size
		queued = true
		src = src[5+size:]
	}
	// What an unfinished message will hold is charged to the server's
	// buffer budget before it is buffered (its length is in its prefix),
	// and its buffer is made that size at once: before, a message grew by
	// append per DATA frame (about 3x its bytes held) and nothing bounded
	// what all the streams held (eight unfinished 32 MiB messages: 802 MB).
	need := 0
	switch {
	case len(src) >= 5:
		need = 5 + int(be32(src[1:5]))
	case len(src) > 0:
		need = 5
	}
	if !st.charge(need) {
		st.fail(status.Errorf(codes.ResourceExhausted, "grpc: a message of %d bytes, over what the server may buffer now (%d bytes for every unfinished message)",
			need-5, st.c.srv.opts.MaxBufferedBytes))
		return queued
	}
	switch {
	case len(src) == 0:
		st.pending = st.pending[:0]
	case len(st.pending) == 0: // the rest of p: keep a copy
		if cap(st.pending) < need {
			st.pending = make([]byte, 0, need)
		}
		st.pending = append(st.pending, src...)
	case len(src) < len(st.pending): // the rest of pending: move it to the front
		k := copy(st.pending, src)
		st.pending = st.pending[:k]
		st.moved += k
	default: // nothing was taken: pending stays as it is (a large message
		// arriving frame by frame must not be copied once per frame)
	}
	if cap(st.pending) > 64<<10 && len(st.pending) == 0 {
		st.pending = nil
	}
	return queued
}

// charge makes the bytes charged to the server's buffer budget for this
// stream's unfinished message need; false (nothing charged) when the
// budget cannot take them. st.mu is held.
func (st *stream) charge(need int) bool {
	d := int64(need) - st.charged
	if d == 0 {
		return true
	}
	b := &st.c.srv.buffered
	if d > 0 && b.Add(d) > st.c.srv.opts.MaxBufferedBytes {
		b.Add(-d)
		return false
	}
	if d < 0 {
		b.Add(d)
	}
	st.charged = int64(need)
	return true
}

// fail ends the receive side with err (after the queued messages); the
// stream's later data is dropped and its window returned. st.mu is held.
func (st *stream) fail(err error) {
	st.failed = true
	st.pending = nil
	st.charge(0)
	if st.recvErr == nil || st.recvErr == io.EOF {
		st.recvErr = err
	}
}

// credit takes what is owed to the peer's window, in batches of a
// quarter window, as long as the handler keeps up (fewer than a window's
// bytes queued): a handler that falls behind stops the peer. The bytes
// of a message still arriving are returned as they come, so a message
// larger than the window is never stuck. st.mu is held.
func (st *stream) credit() int32 {
	w := st.c.srv.opts.StreamWindow
	if st.failed && st.owed > 0 {
		inc := st.owed
		st.owed = 0
		return inc
	}
	if st.halfDone || st.owed < w/4 || st.queued >= int(w) {
		return 0
	}
	inc := st.owed
	st.owed = 0
	return inc
}

func (st *stream) returnWindow(inc int32) error {
	if inc <= 0 {
		return nil
	}
	return st.c.write(func() error { return st.c.fr.WriteWindowUpdate(st.id, uint32(inc)) })
}

// take pops the next queued message, or returns what ends the receive side.
func (st *stream) take() ([]byte, error) {
	for {
		st.mu.Lock()
		st.waiting = false
		if st.head < len(st.msgs) {
			b := st.msgs[st.head]
			st.msgs[st.head] = nil
			st.head++
			if st.head == len(st.msgs) {
				st.msgs, st.head = st.msgs[:0], 0
			}
			st.queued -= 5 + len(b)
			inc := st.credit()
			st.mu.Unlock()
			_ = st.returnWindow(inc)
			return b, nil
		}
		if err := st.recvErr; err != nil {
			st.mu.Unlock()
			return nil, err
		}
		// From here until it takes st.mu again, the handler does nothing
		// with its stream: the reader may hand messages to its inline
		// function (SetInline).
		st.waiting = true
		st.mu.Unlock()
		// Replies left buffered go out before this handler waits; first,
		// the goroutines already runnable (other streams' handlers, the
		// reader) have their turn, and what they write shares the flush.
		if st.c.dirty.Load() {
			runtime.Gosched()
			st.c.flushDirty()
		}
		// One channel, not a select with the context's Done: whatever
		// cancels the stream's context also wakes it (abort, end, the
		// connection's close through abort, a grpc-timeout through
		// context.AfterFunc), and Done would make a channel per stream
		// (selectgo and that channel were 2% of the observer's CPU).
		<-st.signal
		if ctxErr := st.ctx.Err(); ctxErr != nil {
			st.mu.Lock()
			st.waiting = false
			err := st.recvErr
			st.mu.Unlock()
			if err != nil && err != io.EOF {
				return nil, err
			}
			return nil, status.FromContextError(ctxErr).Err()
		}
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

func (st *stream) RecvMsg(m any) error {
	err := st.recvMsg(m)
	if err != nil && err != io.EOF {
		// A receive that failed ends the stream with its status now, as
		// grpc-go's server does (serverStream.RecvMsg writes it): the peer
		// sent what cannot be read (a truncated, compressed or oversized
		// message, one that does not decode), or the stream is over. The
		// handler's own status is then dropped. Before, a handler that
		// returned nil after such a receive answered grpc-status 0 to a
		// stream it never read (the differential test).
		st.finish(err)
		st.cancel()
	}
	return err
}

func (st *stream) recvMsg(m any) error {
	// The message before this one may have pointed into its buffer
	// (AliasingCodec) until now.
	if st.held != nil {
		putBuf(st.held)
		st.held = nil
	}
	b, err := st.take()
	if err != nil {
		return err
	}
	switch srv := st.c.srv; {
	case srv.aliasCodec != nil:
		var aliased bool
		if aliased, err = srv.aliasCodec.UnmarshalBytesAliased(b, m); aliased {
			st.held, b = b, nil
		}
	case srv.bytesCodec != nil:
		err = srv.bytesCodec.UnmarshalBytes(b, m)
	default:
		err = srv.opts.Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
	}
	if b != nil {
		putBuf(b)
	}
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}

func (st *stream) SendMsg(m any) error {
	st.smu.Lock()
	defer st.smu.Unlock()
	b, err := st.marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	b[0] = 0
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	if !st.headerSent {
		// Buffered, not flushed: the message follows at once, and the two
		// go out in one write (a flush each was a system call more per
		// stream).
		if err := st.writeHeader(false); err != nil {
			return err
		}
	}
	err = st.writeData(b)
	if cap(st.wbuf) > 64<<10 {
		st.wbuf = nil
	}
	return err
}

// marshal returns m's encoding after 5 bytes of room for its prefix, in
// the stream's reused buffer.
func (st *stream) marshal(m any) ([]byte, error) {
	if bc := st.c.srv.bytesCodec; bc != nil {
		if cap(st.wbuf) < 5 {
			st.wbuf = make([]byte, 5, 512)
		}
		b, err := bc.AppendMarshal(st.wbuf[:5], m)
		if err == nil {
			st.wbuf = b
		}
		return b, err
	}
	data, err := st.c.srv.opts.Codec.Marshal(m)
	if err != nil {
		return nil, err
	}
	n := data.Len()
	if cap(st.wbuf) < 5+n {
		st.wbuf = make([]byte, 5+n)
	}
	b := st.wbuf[:5+n]
	data.CopyTo(b[5:])
	data.Free()
	return b, nil
}

func (st *stream) sendHeader() error { return st.writeHeader(true) }

// writeHeader writes the response headers, flushed or left for the next
// flush. st.smu is held.
func (st *stream) writeHeader(flush bool) error {
	if st.headerSent {
		return status.Error(codes.Internal, "grpc: headers already sent")
	}
	st.headerSent = true
	return st.c.writeFlush(func() error {
		if st.isReset() { // ended meanwhile: its trailers went out, or a reset
			return nil
		}
		return st.c.writeHeaderFrame(st.id, false, st.responseHeaders())
	}, flush)
}

func (st *stream) responseHeaders() []hpack.HeaderField {
	hs := make([]hpack.HeaderField, 0, 2+len(st.header))
	hs = append(hs, hpack.HeaderField{Name: ":status", Value: "200"}, hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	return appendMetadata(hs, st.header)
}

// writeData writes b in DATA frames as the peer's windows allow; the last
// is left buffered (conn.writeLater).
func (st *stream) writeData(b []byte) error {
	c := st.c
	for len(b) > 0 {
		c.mu.Lock()
		for (c.connSend <= 0 || st.sendWindow <= 0) && !c.closed && !st.isReset() {
			// A deadline (grpc-timeout) ends the wait as it ends a
			// receive's (the stream's context.AfterFunc broadcasts): before,
			// a peer that gave no window held the handler past it.
			if err := st.ctx.Err(); err != nil {
				c.mu.Unlock()
				return status.FromContextError(err).Err()
			}
			c.cond.Wait()
		}
		if c.closed || st.isReset() {
			c.mu.Unlock()
			if err := st.ctx.Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return status.Error(codes.Unavailable, "the stream or connection ended")
		}
		n := int64(len(b))
		n = min(n, c.connSend, st.sendWindow, int64(c.peerMaxFrame))
		c.connSend -= n
		st.sendWindow -= n
		c.mu.Unlock()
		chunk := b[:n]
		b = b[n:]
		w := c.write
		if len(b) == 0 {
			w = c.writeLater
		}
		skipped := false
		if err := w(func() error {
			// Checked with the writing side held: a reset (abort, finish)
			// marks the stream before it writes RST_STREAM, so no DATA
			// follows one.
			if st.isReset() {
				skipped = true
				return nil
			}
			c.sentSincePing.Store(true)
			return c.fr.WriteData(st.id, false, chunk)
		}); err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		if skipped {
			return status.Error(codes.Canceled, "the stream was reset")
		}
	}
	return nil
}

func (st *stream) isReset() bool {
	st.mu.Lock()
	r := st.reset
	st.mu.Unlock()
	return r
}

// finish sends the handler's status as trailers, unless the stream was
// reset; and resets the stream if the peer has not ended its side (its
// remaining messages are not wanted), as grpc-go does.
func (st *stream) finish(err error) {
	st.mu.Lock()
	reset, half := st.reset, st.halfDone
	st.reset = true // nothing else is written
	st.mu.Unlock()
	// A send still waiting for window (on a goroutine the handler left
	// behind) wakes, sees the stream ended and gives up its smu.
	st.c.mu.Lock()
	st.c.cond.Broadcast()
	st.c.mu.Unlock()
	if reset {
		return
	}
	st.smu.Lock()
	defer st.smu.Unlock()
	s := status.Convert(err)
	// Left for the next flush (conn.writeLater): nothing waits for a
	// stream's end as it waits for a reply, and the trailers share a write
	// with whatever goes out next (a system call each before).
	_ = st.c.writeLater(func() error {
		if err := st.c.writeTrailers(st, s); err != nil {
			return err
		}
		if !half {
			return st.c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		return nil
	})
}

// writeTrailers writes the status (trailers-only if no header was sent).
// c.wmu is held.
func (c *conn) writeTrailers(st *stream, s *status.Status) error {
	var hs []hpack.HeaderField
	if !st.headerSent {
		st.headerSent = true
		hs = st.responseHeaders()
	}
	hs = appendStatus(hs, s)
	hs = appendMetadata(hs, st.trailer)
	return c.writeHeaderFrame(st.id, true, hs)
}

// answer writes writeStatusOnly's answer to a stream that is not opened.
func (c *conn) answer(id uint32, httpStatus int, s *status.Status) error {
	return c.write(func() error { return c.writeStatusOnly(id, httpStatus, s) })
}

// writeStatusOnly answers a stream that is not opened: an HTTP status,
// and a gRPC one if s is set. c.wmu is held.
func (c *conn) writeStatusOnly(id uint32, httpStatus int, s *status.Status) error {
	hs := []hpack.HeaderField{{Name: ":status", Value: fmt.Sprint(httpStatus)}}
	if s != nil {
		hs = append(hs, hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		hs = appendStatus(hs, s)
	}
	return c.writeHeaderFrame(id, true, hs)
}

// writeHeaderFrame encodes hs and writes it as HEADERS and CONTINUATION
// frames. c.wmu is held.
func (c *conn) writeHeaderFrame(id uint32, end bool, hs []hpack.HeaderField) error {
	c.sentSincePing.Store(true)
	c.hbuf.Reset()
	for _, h := range hs {
		if err := c.henc.WriteField(h); err != nil {
			return err
		}
	}
	block := c.hbuf.Bytes()
	c.mu.Lock()
	frame := int(c.peerMaxFrame)
	c.mu.Unlock()
	first := block
	if len(first) > frame {
		first = first[:frame]
	}
	block = block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: end, EndHeaders: len(block) == 0}); err != nil {
		return err
	}
	for len(block) > 0 {
		next := block
		if len(next) > frame {
			next = next[:frame]
		}
		block = block[len(next):]
		if err := c.fr.WriteContinuation(id, len(block) == 0, next); err != nil {
			return err
		}
	}
	return nil
}
