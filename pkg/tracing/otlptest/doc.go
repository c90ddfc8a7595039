// Package otlptest is an OTLP trace receiver for tests: the collector's
// own protocol (OTLP over gRPC and over HTTP, the protobuf messages of
// go.opentelemetry.io/proto/otlp), in process, keeping every span it is
// sent. Tests check what fusebox exports on the wire, not what it asked an
// SDK for.
package otlptest
