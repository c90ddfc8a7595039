package grpcwire

import (
	"context"
	"time"
)

// SetInline gives the stream whose context ctx is an inline function, and
// reports whether it is a stream of this transport (false: nothing was
// set). From then on, a message that arrives while the stream's handler
// waits in Recv with nothing queued is first offered to fn, on the
// connection's reader goroutine: when fn returns true the message is
// handled and Recv never returns it; when it returns false, it is queued
// for Recv as usual. msg is valid only during the call.
//
// fn runs while the handler waits, never at the same time as it, and in
// the messages' order; it must not block (every stream of the connection
// waits for it), nor use the stream (Send, Recv). A panic in fn is
// recovered and ends its inlining: that message and the rest are queued.
//
// It is for one-way messages a handler only reads, such as the observer
// role's chunks (processor): handed to the stream's goroutine, each batch
// of them was a wake-up, a copy out of the frame and a cold cache on
// another core.
func SetInline(ctx context.Context, fn func(msg []byte) bool) bool {
	st, ok := ctx.Value(streamKey{}).(*stream)
	if !ok {
		return false
	}
	st.mu.Lock()
	st.inline = fn
	st.mu.Unlock()
	return true
}

// The reader's budget for inline functions: every other stream of the
// connection waits while one runs (an Envoy worker's request-path streams
// share the connection with its observer streams). Past a budget the
// work is handed to the streams' own goroutines, as it is on grpc-go's
// server, instead of stalling the reader:
//   - a message over inlineMaxBytes is never offered (a large chunk costs
//     in proportion to its size; Envoy's are one DATA frame, 16 KiB);
//   - once inline calls took inlineBatchBudget since the reader last went
//     to the socket, further messages are queued until it next does;
//   - a stream whose call took over inlineSlowCall has its inlining ended:
//     its handler's judging is slow, and it judges on its own goroutine.
//
// So the reader is stalled at most inlineBatchBudget plus one call per
// read, and one slow call per stream.
const (
	inlineMaxBytes    = 16 << 10
	inlineBatchBudget = time.Millisecond
	inlineSlowCall    = 500 * time.Microsecond
)

// offerInline offers msg to the inline function within the reader's
// budget, and reports whether it was handled. st.mu is held; it runs on
// the reader.
func (st *stream) offerInline(msg []byte) bool {
	c := st.c
	if len(msg) > inlineMaxBytes || c.inlineSpent >= inlineBatchBudget {
		return false
	}
	t0 := time.Now()
	handled := st.callInline(msg)
	d := time.Since(t0)
	c.inlineSpent += d
	slow := inlineSlowCall
	if c.srv.opts.inlineSlowCall > 0 {
		slow = c.srv.opts.inlineSlowCall
	}
	if d > slow {
		st.inline = nil
		c.srv.inlineSlow.Add(1)
	}
	return handled
}

// callInline offers msg to the inline function. st.mu is held.
func (st *stream) callInline(msg []byte) (handled bool) {
	defer func() {
		if r := recover(); r != nil {
			st.inline, handled = nil, false
		}
	}()
	if poisonBuffers {
		// The frame is the reader's: valid during the call, not after (a
		// declined message is copied from it next, so it stays).
		defer func() {
			if handled {
				poison(msg)
			}
		}()
	}
	return st.inline(msg)
}
