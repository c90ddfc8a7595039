// Command wirebench measures the cost Envoy really sees (make bench-wire):
// fusebox runs in its own process, and full request lifecycles are driven
// over gRPC as Envoy drives them with the shipped modes (request headers, an
// 8 KiB buffered body, response headers, 50 streamed SSE chunks pipelined),
// 32 streams at a time. A null CONTINUE server (nullproc) is measured in the
// same run, in alternating rounds. It reports each server's process CPU per
// request (from /proc, the server alone, not the driver) and the
// per-message latency p50/p99, and the ratio of the two.
package main
