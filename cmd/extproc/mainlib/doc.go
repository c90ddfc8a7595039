// Package mainlib wires fusebox together: flags, config, listeners, the
// ext_proc and health gRPC services, the admin HTTP server, reload and
// graceful shutdown. It holds no product logic.
package mainlib
