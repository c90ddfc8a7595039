// Package grpcwire is fusebox's gRPC server transport: gRPC over HTTP/2
// (h2c or TLS with ALPN h2), for the services fusebox registers on its
// ext_proc listener (ext_proc, the access log service, grpc.health.v1).
//
// It owns the connection (preface, settings, pings, keepalive, idle
// close, graceful GOAWAY), flow control in both directions, gRPC's
// length-prefixed messages and its status trailers, and hands each stream
// to the service's generated handler through grpc.ServerStream, so that
// the services are the same code on this transport as on grpc-go's.
//
// Why not grpc-go's server: Envoy drives ext_proc with one small message
// per HTTP/2 DATA frame, 53 of them per request, and grpc-go's server
// hands each one across three goroutines (frame reader, stream, loopy
// writer) with a buffer allocated per frame; that was most of a null
// server's CPU (pprof under make bench-wire). Here the connection's reader
// reads a DATA frame in place in its buffer, queues its messages and wakes
// the stream's goroutine, which writes its reply itself. Writes are
// batched across streams: a reply goes out as its handler waits again,
// after the goroutines already runnable added theirs, a stream's trailers
// as the reader next goes to the socket, and the reader yields before that
// read when it woke a handler (conn.go, writeLater). A stream's handler may
// also end its stream from elsewhere (EndFunc: a lifetime bound on a
// timer), leave its messages' bytes in the transport's buffer until its
// next receive (AliasingCodec), and have one-way messages handled on the
// reader while it waits (SetInline). What it does not do,
// because fusebox's listener needs none of it: compression (a compressed
// message is refused, Unimplemented), server push, interceptors, stats
// handlers, grpc.SetHeader on a context.
package grpcwire
