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
// queues a message and wakes the stream's goroutine, which writes its
// reply itself; concurrent writers share one flush. What it does not do,
// because fusebox's listener needs none of it: compression (a compressed
// message is refused, Unimplemented), server push, interceptors, stats
// handlers, grpc.SetHeader on a context.
package grpcwire
