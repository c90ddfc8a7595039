// Package tracing owns fusebox's OpenTelemetry spans (SPEC §17): the
// tracer provider and its OTLP exporter (gRPC or HTTP, set by the config's
// tracing section over the standard OTEL_* variables), the trace context
// Envoy sends on an ext_proc stream, and the spans a request's trace shows
// of fusebox: fusebox.decide (the decision, a child of Envoy's span),
// fusebox.outcome (its outcome, whenever and by whichever channel it
// arrives, with a fusebox.transition event when it moved the breaker) and
// fusebox.attempt (each failover attempt, a child of the decision).
//
// Tracing is off unless asked for; then the processor holds a nil *Tracer
// and every call here is a nil check. Sampling follows the parent: a
// request Envoy does not sample, or one with no trace context, makes no
// span. A span never carries a prompt, a completion or a header value:
// every attribute is one of fusebox's own names (names.go).
package tracing
