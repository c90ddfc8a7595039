package grpcwire

import (
	"io"
	"runtime"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

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
			if st.head < len(st.msgs) {
				// What arrived before the end is read first: a message
				// and the peer's RST_STREAM can both land while the
				// handler waits (Envoy's last chunk, then its reset when
				// the reply timed out), and the message was sent.
				st.mu.Unlock()
				continue
			}
			err := st.recvErr
			st.mu.Unlock()
			if err != nil && err != io.EOF {
				return nil, err
			}
			return nil, status.FromContextError(ctxErr).Err()
		}
	}
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
