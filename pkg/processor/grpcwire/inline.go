package grpcwire

import (
	"context"
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
