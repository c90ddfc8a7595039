package processor

import "google.golang.org/grpc"

// TransportOptions are the gRPC flow-control settings of fusebox's ext_proc
// server (mainlib adds them; make bench-wire gives its null baseline the
// same, so that its ratios are fusebox's own work).
//
// Static windows: by default gRPC estimates the bandwidth-delay product,
// pinging the peer as data arrives and growing the windows to match, a
// cost on every read that a loopback sidecar pays for nothing (pprof under
// bench-wire). 256 KiB per stream is four times gRPC's starting window and
// far more than a chunk; 4 MiB per connection bounds what Envoy can have in
// flight to one fusebox at once (BDP estimation may grow both to 16 MiB).
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
	}
}

// StreamWindow and ConnWindow are those windows, for either server
// (grpcwire takes them as Options).
const (
	StreamWindow = 256 << 10
	ConnWindow   = 4 << 20
)
