// Package streamlife owns the lifetime bounds of fusebox's gRPC streams
// (R-L13, limits.max_stream_idle_sec and limits.max_stream_duration_sec):
// a stream Envoy never finishes must not hold a goroutine and its buffers
// for ever. On grpc-go's server a timer per stream watches it (Watch); on
// fusebox's own transport one sweep checks every live stream (Sweep) and
// ends those past a bound through the transport's EndFunc.
//
// It knows nothing of ext_proc: the processor hands it each stream's
// Activity and its Bounds. It imports only metrics (the refusal names).
package streamlife
