package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// Settings are the tracing section's fields (routes.TracingConfig).
type Settings struct {
	Enabled     *bool
	Endpoint    string
	Protocol    string
	ServiceName string
}

// Resolved is what the exporter runs with, the file over the environment.
type Resolved struct {
	Endpoint    string // "" = the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, or its default
	Protocol    string // grpc | http/protobuf
	ServiceName string
}

// Resolve says whether tracing is on and with what (R-TR1): the file's
// fields win over the OTEL_* variables, as elsewhere in fusebox.
func Resolve(s Settings, getenv func(string) string) (Resolved, bool, error) {
	on := strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "otlp")
	if s.Enabled != nil {
		on = *s.Enabled
	}
	if !on {
		return Resolved{}, false, nil
	}
	r := Resolved{Endpoint: s.Endpoint, Protocol: s.Protocol, ServiceName: s.ServiceName}
	if r.Protocol == "" {
		r.Protocol = firstSet(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
	}
	if r.Protocol != "grpc" && r.Protocol != "http/protobuf" {
		return Resolved{}, false, fmt.Errorf("tracing: OTLP protocol %q: fusebox exports with grpc or http/protobuf", r.Protocol)
	}
	if r.ServiceName == "" {
		r.ServiceName = firstSet(getenv("OTEL_SERVICE_NAME"), "fusebox")
	}
	return r, true, nil
}

func firstSet(v ...string) string {
	for _, s := range v {
		if s = strings.TrimSpace(s); s != "" {
			return s
		}
	}
	return ""
}

// Tracer makes fusebox's spans. A nil *Tracer is tracing off: every
// method is then a nil check and nothing else.
type Tracer struct {
	tp      *sdktrace.TracerProvider
	tr      trace.Tracer
	prop    propagation.TextMapPropagator
	replica string
}

// Start builds the tracer provider and its OTLP exporter, or returns nil
// when tracing is off. The exporter sends in batches off the request path;
// a collector that is down loses spans, never delays a decision.
func Start(ctx context.Context, r Resolved, replica string) (*Tracer, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch r.Protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if r.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(r.Endpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		var opts []otlptracehttp.Option
		if r.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimSuffix(r.Endpoint, "/")+"/v1/traces"))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithAttributes(attribute.String("service.name", r.ServiceName)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: the resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		// Envoy decides: a request it samples has fusebox's spans, one it
		// does not (or one with no trace context) has none.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)),
		sdktrace.WithResource(res),
	)
	return New(tp, replica), nil
}

// New makes a Tracer on tp (tests give it a provider of their own).
func New(tp *sdktrace.TracerProvider, replica string) *Tracer {
	return &Tracer{tp: tp, tr: tp.Tracer("github.com/fusebox-llm/fusebox"), replica: replica,
		// Envoy's OpenTelemetry tracer sends W3C traceparent (and
		// tracestate); its Zipkin tracer the B3 headers (docs/envoy/tracing.md).
		prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader)))}
}

// Shutdown sends what is batched, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Parent is the trace context Envoy sent on an ext_proc stream (its gRPC
// metadata, ctx's incoming metadata): invalid when there is none, or when
// tracing is off.
func (t *Tracer) Parent(ctx context.Context) trace.SpanContext {
	if t == nil {
		return trace.SpanContext{}
	}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), mdCarrier(md)))
}

// mdCarrier reads gRPC metadata as a propagation carrier (keys are lower
// case there, as the propagators ask for them).
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}
