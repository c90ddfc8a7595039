package processor

import (
	"context"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/tracing"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"
)

// BenchmarkLifecycleTracing is BenchmarkLifecycle's full request through
// fusebox with tracing off, on with Envoy's context unsampled, and on at
// 100 % sampling (the SDK's batcher, to an exporter that keeps nothing),
// in the same run (#55: off must cost what it did; on is measured).
func BenchmarkLifecycleTracing(b *testing.B) {
	l := newLifecycle()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"
	on := func(b *testing.B) *tracing.Tracer {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
			sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tracing.New(tp, "bench")
	}
	for _, tc := range []struct {
		name   string
		tracer bool
		flags  string // "" = no trace context sent
	}{
		{"off", false, "01"},
		{"on-unsampled", true, "00"},
		{"on-sampled", true, "01"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := fuseboxBenchServer(b, func(o *Options) {
				if tc.tracer {
					o.Tracer = on(b)
				}
			})
			client := benchServer(b, srv)
			ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", tp+tc.flags)
			l.runCtx(b, ctx, client)
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpuTime()
			for b.Loop() {
				l.runCtx(b, ctx, client)
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
		})
	}
}
