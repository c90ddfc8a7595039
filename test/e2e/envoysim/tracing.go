package envoysim

import (
	"context"
	"math/rand/v2"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// TracingConfig is the connection manager's tracing with Envoy's
// OpenTelemetry tracer (http_connection_manager.tracing, provider
// envoy.tracers.opentelemetry): each request gets a span, sampled at
// RandomSampling percent (Envoy's default 100) unless the client sent a
// trace context, whose sampling it follows; the ext_proc filter's stream
// gets a child span, "async envoy.service.ext_proc.v3.ExternalProcessor.Process
// egress", whose context Envoy's async gRPC client injects in the stream's
// initial metadata: the OpenTelemetry tracer writes traceparent and
// tracestate (tracers/opentelemetry/tracer.cc, Span::injectContext;
// docs/envoy/tracing.md). The spans go by OTLP over gRPC to Addr (the
// tracer's grpc_service cluster).
type TracingConfig struct {
	Cluster        string // the tracer's grpc_service cluster
	Addr           string // host:port of the collector's cluster
	ServiceName    string
	RandomSampling float64 // percent; 0 = Envoy's default, 100
}

// tracer plays Envoy's tracer for one proxy.
type tracer struct {
	tp       *sdktrace.TracerProvider
	tr       trace.Tracer
	sampling float64
	prop     propagation.TraceContext
}

func newTracer(c TracingConfig) (*tracer, error) {
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(c.Addr), otlptracegrpc.WithInsecure())
	if err != nil {
		return nil, err
	}
	name := c.ServiceName
	if name == "" {
		name = "envoy"
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))))
	s := c.RandomSampling
	if s == 0 {
		s = 100
	}
	return &tracer{tp: tp, tr: tp.Tracer("envoysim"), sampling: s}, nil
}

// requestSpan starts the request's span: under the client's trace context
// when it sent one (and with its sampling), else a new trace sampled at
// random_sampling. An unsampled request gets a non-recording span whose
// context still travels (sampled flag off), as Envoy's does.
func (t *tracer) requestSpan(h headers, path string) (context.Context, trace.Span) {
	ctx := context.Background()
	if tp, ok := h.get("traceparent"); ok {
		ts, _ := h.get("tracestate")
		ctx = t.prop.Extract(ctx, propagation.MapCarrier{"traceparent": tp, "tracestate": ts})
	}
	parent := trace.SpanContextFromContext(ctx)
	if !parent.IsValid() && rand.Float64()*100 >= t.sampling {
		// Not sampled: a context with the flag off.
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: newTraceID(), SpanID: newSpanID()})
		return trace.ContextWithSpanContext(ctx, sc), trace.SpanFromContext(trace.ContextWithSpanContext(ctx, sc))
	}
	if parent.IsValid() && !parent.IsSampled() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.tr.Start(ctx, "ingress "+strings.SplitN(path, "?", 2)[0], trace.WithSpanKind(trace.SpanKindServer))
}

// extProcSpan starts the ext_proc stream's client span and writes its
// context into md, as the async gRPC client does.
func (t *tracer) extProcSpan(ctx context.Context, md metadata.MD) trace.Span {
	var sp trace.Span
	if trace.SpanFromContext(ctx).IsRecording() {
		ctx, sp = t.tr.Start(ctx, "async envoy.service.ext_proc.v3.ExternalProcessor.Process egress", trace.WithSpanKind(trace.SpanKindClient))
	} else {
		sc := trace.SpanContextFromContext(ctx)
		sc = sc.WithSpanID(newSpanID())
		ctx = trace.ContextWithSpanContext(ctx, sc)
		sp = trace.SpanFromContext(ctx)
	}
	c := propagation.MapCarrier{}
	t.prop.Inject(ctx, c)
	for k, v := range c {
		md.Set(k, v)
	}
	return sp
}

func (t *tracer) close() { _ = t.tp.Shutdown(context.Background()) }

func newTraceID() (id trace.TraceID) {
	for i := range id {
		id[i] = byte(rand.UintN(256))
	}
	return id
}

func newSpanID() (id trace.SpanID) {
	for i := range id {
		id[i] = byte(rand.UintN(256))
	}
	return id
}
