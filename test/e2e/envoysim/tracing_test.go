package envoysim

import (
	"net/url"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/tracing/otlptest"
)

// TestTracingSendsTheTraceContext (docs/envoy/tracing.md): with the
// OpenTelemetry tracer on, the ext_proc stream's initial metadata carries
// traceparent (the async gRPC client's span, a child of the request's)
// and tracestate; a client's trace context is continued, with its sampled
// flag; without tracing no trace header goes on the stream.
func TestTracingSendsTheTraceContext(t *testing.T) {
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, c := range []struct {
		name, clientTP string
		traced         bool
		wantSampled    string // the flags of the traceparent sent
		wantTrace      string // "" = any
	}{
		{"a new trace, sampled at 100 %", "", true, "01", ""},
		{"the client's trace, sampled", "00-" + clientTrace + "-00f067aa0ba902b7-01", true, "01", clientTrace},
		{"the client's trace, not sampled", "00-" + clientTrace + "-00f067aa0ba902b7-00", true, "00", clientTrace},
		{"no tracer: nothing sent", "00-" + clientTrace + "-00f067aa0ba902b7-01", false, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			rcv := otlptest.Start(t)
			u, _ := url.Parse(rcv.GRPC)
			r := newRig(t, plain, func(cfg *Config) {
				if c.traced {
					cfg.Tracing = &TracingConfig{Cluster: "otel_collector", Addr: u.Host, ServiceName: "envoy"}
				}
			})
			var hdr []string
			if c.clientTP != "" {
				hdr = []string{"traceparent", c.clientTP}
			}
			r.post(`{"a":1}`, hdr...)
			r.proxy.Close()
			r.proc.mu.Lock()
			tp := r.proc.md[0].Get("traceparent")
			r.proc.mu.Unlock()
			if !c.traced {
				if len(tp) != 0 {
					t.Fatalf("traceparent %v sent with no tracer", tp)
				}
				return
			}
			if len(tp) != 1 {
				t.Fatalf("traceparent %v", tp)
			}
			parts := strings.Split(tp[0], "-")
			if len(parts) != 4 || parts[0] != "00" || parts[3] != c.wantSampled || (c.wantTrace != "" && parts[1] != c.wantTrace) {
				t.Fatalf("traceparent %q", tp[0])
			}
			if c.wantSampled == "01" {
				var egress bool
				for _, s := range rcv.Spans() {
					if s.ID == parts[2] && strings.HasSuffix(s.Name, "ExternalProcessor.Process egress") && s.Service == "envoy" {
						egress = true
					}
				}
				if !egress {
					t.Fatalf("the stream's context %s is not the egress span Envoy exported: %+v", parts[2], rcv.Spans())
				}
			} else if n := len(rcv.Spans()); n != 0 {
				t.Fatalf("%d spans exported for an unsampled request", n)
			}
		})
	}
}
