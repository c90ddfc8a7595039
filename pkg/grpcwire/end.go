package grpcwire

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// streamKey is the context key of a stream (EndFunc, SetInline).
type streamKey struct{}

// EndFunc returns the function that ends the stream whose context ctx is
// (a stream of this transport; nil otherwise): it sends err's status
// now, as if the handler had returned err, and cancels the stream, so the
// handler's receive fails (Canceled) and nothing it sends later is
// written. The handler still returns as usual; its own status is then
// dropped.
//
// gRPC gives a handler no other way to end its stream than to return, and
// a handler waiting in Recv cannot: so grpc-go's server needs a second
// goroutine per stream to watch its lifetime (processor, lifetime.go),
// which this lets one sweep do instead (a handoff between two goroutines
// per stream was 8% of the observer's CPU, make bench-wire -compare).
func EndFunc(ctx context.Context) func(err error) {
	if st, ok := ctx.Value(streamKey{}).(*stream); ok {
		return st.end
	}
	return nil
}

// end is the stream's EndFunc.
func (st *stream) end(err error) {
	if err == nil {
		err = status.Error(codes.OK, "")
	}
	st.finish(err)
	// What the peer sends from now on is dropped (its window returned);
	// the messages queued before are still the handler's to take, and
	// then its receive fails, unless the peer had ended its side.
	st.mu.Lock()
	st.failed, st.pending = true, nil
	if st.recvErr == nil {
		st.recvErr = status.Error(codes.Canceled, "fusebox ended the stream")
	}
	st.mu.Unlock()
	st.cancel()
	st.wake()
}
