package tracing_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/tracing"
	"github.com/fusebox-llm/fusebox/pkg/tracing/otlptest"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func ptr[T any](v T) *T { return &v }

// R-TR1: off unless asked; the file's fields win over the environment.
func TestResolve(t *testing.T) {
	for _, c := range []struct {
		name string
		s    tracing.Settings
		env  map[string]string
		on   bool
		want tracing.Resolved
		err  bool
	}{
		{"off by default", tracing.Settings{}, nil, false, tracing.Resolved{}, false},
		{"on by the environment", tracing.Settings{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true,
			tracing.Resolved{Protocol: "http/protobuf", ServiceName: "fusebox"}, false},
		{"another exporter named is not ours", tracing.Settings{}, map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false, tracing.Resolved{}, false},
		{"the file turns it off over the environment", tracing.Settings{Enabled: ptr(false)}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, false, tracing.Resolved{}, false},
		{"the environment's protocol and name", tracing.Settings{Enabled: ptr(true)},
			map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "edge-fusebox"}, true,
			tracing.Resolved{Protocol: "grpc", ServiceName: "edge-fusebox"}, false},
		{"the traces protocol over the general one", tracing.Settings{Enabled: ptr(true)},
			map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true,
			tracing.Resolved{Protocol: "http/protobuf", ServiceName: "fusebox"}, false},
		{"the file over the environment", tracing.Settings{Enabled: ptr(true), Protocol: "grpc", Endpoint: "http://collector:4317", ServiceName: "fb"},
			map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "x"}, true,
			tracing.Resolved{Protocol: "grpc", Endpoint: "http://collector:4317", ServiceName: "fb"}, false},
		{"a protocol fusebox does not export with", tracing.Settings{Enabled: ptr(true)}, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false, tracing.Resolved{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, on, err := tracing.Resolve(c.s, env(c.env))
			if (err != nil) != c.err || on != c.on || r != c.want {
				t.Fatalf("got %+v, %v, %v; want %+v, %v, error %v", r, on, err, c.want, c.on, c.err)
			}
		})
	}
}

const (
	traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID  = "00f067aa0ba902b7"
)

// The context Envoy sends on the ext_proc stream: W3C traceparent (its
// OpenTelemetry tracer) or B3 (its Zipkin tracer), sampled or not.
func TestParent(t *testing.T) {
	tr := tracing.New(sdktrace.NewTracerProvider(), "r0")
	for _, c := range []struct {
		name      string
		md        metadata.MD
		valid, on bool
	}{
		{"traceparent, sampled", metadata.Pairs("traceparent", "00-"+traceID+"-"+spanID+"-01"), true, true},
		{"traceparent, not sampled", metadata.Pairs("traceparent", "00-"+traceID+"-"+spanID+"-00"), true, false},
		{"B3 headers", metadata.Pairs("x-b3-traceid", traceID, "x-b3-spanid", spanID, "x-b3-sampled", "1"), true, true},
		{"B3 single header", metadata.Pairs("b3", traceID+"-"+spanID+"-1"), true, true},
		{"none", metadata.Pairs("x-fusebox-role", "route"), false, false},
		{"malformed", metadata.Pairs("traceparent", "00-zz-"+spanID+"-01"), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := tr.Parent(metadata.NewIncomingContext(context.Background(), c.md))
			if sc.IsValid() != c.valid || sc.IsSampled() != c.on {
				t.Fatalf("valid %v sampled %v; want %v %v", sc.IsValid(), sc.IsSampled(), c.valid, c.on)
			}
			if c.valid && sc.TraceID().String() != traceID {
				t.Fatalf("trace %s", sc.TraceID())
			}
		})
	}
	var off *tracing.Tracer
	if off.Parent(metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", "00-"+traceID+"-"+spanID+"-01"))).IsValid() {
		t.Fatal("tracing off read a parent")
	}
}

// FuzzParent: whatever Envoy (or a peer) sends as metadata, reading the
// parent never panics, and a context it returns is valid or empty.
func FuzzParent(f *testing.F) {
	f.Add("traceparent", "00-"+traceID+"-"+spanID+"-01")
	f.Add("b3", traceID+"-"+spanID+"-1-"+spanID)
	f.Add("x-b3-traceid", traceID)
	f.Add("tracestate", "a=b,c=d")
	tr := tracing.New(sdktrace.NewTracerProvider(), "r0")
	f.Fuzz(func(t *testing.T, k, v string) {
		md := metadata.MD{}
		md[k] = []string{v}
		sc := tr.Parent(metadata.NewIncomingContext(context.Background(), md))
		if sc.IsValid() && (!sc.TraceID().IsValid() || !sc.SpanID().IsValid()) {
			t.Fatalf("a valid context with an invalid id: %v", sc)
		}
	})
}

// R-TR2, R-TR3 on the wire, over both OTLP protocols: the decision's
// span a child of Envoy's, its outcome a child while it is open, a late
// outcome linked to it in the same trace, an attempt under it, a
// transition as an event; nothing for an unsampled parent.
func TestSpansOnTheWire(t *testing.T) {
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(proto, func(t *testing.T) {
			rcv := otlptest.Start(t)
			ep := rcv.HTTP
			if proto == "grpc" {
				ep = rcv.GRPC
			}
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			r, on, err := tracing.Resolve(tracing.Settings{Enabled: ptr(true), Protocol: proto, Endpoint: ep}, env(nil))
			if err != nil || !on {
				t.Fatal(on, err)
			}
			tr, err := tracing.Start(context.Background(), r, "replica-a")
			if err != nil {
				t.Fatal(err)
			}
			parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTrace(t), SpanID: mustSpan(t), TraceFlags: trace.FlagsSampled, Remote: true})
			t0 := time.Unix(1_800_000_000, 0)
			d := tr.Decide(parent, tracing.Decision{Start: t0, Gateway: "default", Model: "gpt-4o-mini", Provider: "azure",
				Route: "azure:eu:gpt-4o-mini", ID: "d1", Action: "skipped", DecidedBy: "memory", State: "closed", Generation: 3, PolicyVersion: "v9",
				Candidates: []string{"openai:us:gpt-4o-mini:open", "azure:eu:gpt-4o-mini:chosen"}})
			a := d.Attempt(1, "azure:eu:gpt-4o-mini", "azure", t0.Add(time.Millisecond))
			a.Outcome(tracing.Outcome{End: t0.Add(2 * time.Millisecond), Route: "azure:eu:gpt-4o-mini", Class: "success", Reason: "", Origin: "", Channel: tracing.ChannelStream})
			a.End(t0.Add(3 * time.Millisecond))
			d.Outcome(tracing.Outcome{End: t0.Add(4 * time.Millisecond), Route: "azure:eu:gpt-4o-mini", Class: "failure", Reason: "provider_5xx", Origin: "upstream", Channel: tracing.ChannelStream,
				Transitions: []tracing.Transition{{At: t0.Add(4 * time.Millisecond), Route: "azure:eu:gpt-4o-mini", Transition: "closed->open", Reason: "provider_5xx", Failures: 5, Threshold: 5, OpenUntil: t0.Add(30 * time.Second)}}})
			d.End(t0.Add(5 * time.Millisecond))
			d.Outcome(tracing.Outcome{End: t0.Add(time.Second), Route: "azure:eu:gpt-4o-mini", Class: "neither", Reason: "cut_mid_answer", Origin: "local", Channel: tracing.ChannelAccessLog})
			unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTrace(t), SpanID: mustSpan(t), Remote: true})
			if tr.Decide(unsampled, tracing.Decision{Start: t0}) != nil {
				t.Error("a span for a request Envoy did not sample")
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			dec := one(t, rcv.Named(tracing.SpanDecide))
			if dec.TraceID != parent.TraceID().String() || dec.ParentID != parent.SpanID().String() || dec.Service != "fusebox" {
				t.Errorf("decision span %+v: not a child of Envoy's %s", dec, parent.SpanID())
			}
			for k, v := range map[string]any{tracing.AttrGateway: "default", tracing.AttrModel: "gpt-4o-mini", tracing.AttrProvider: "azure",
				tracing.AttrRoute: "azure:eu:gpt-4o-mini", tracing.AttrDecision: "d1", tracing.AttrDecidedBy: "memory", tracing.AttrState: "closed",
				tracing.AttrGeneration: int64(3), tracing.AttrPolicyVersion: "v9", tracing.AttrReplica: "replica-a", tracing.AttrAction: "skipped"} {
				if dec.Attrs[k] != v {
					t.Errorf("decision %s = %v, want %v", k, dec.Attrs[k], v)
				}
			}
			if c, _ := dec.Attrs[tracing.AttrCandidates].([]any); len(c) != 2 || c[0] != "openai:us:gpt-4o-mini:open" {
				t.Errorf("candidates %v", dec.Attrs[tracing.AttrCandidates])
			}
			att := one(t, rcv.Named(tracing.SpanAttempt))
			if att.ParentID != dec.ID || att.Attrs[tracing.AttrAttempt] != int64(1) {
				t.Errorf("attempt %+v: not under the decision %s", att, dec.ID)
			}
			var inOpen, late, ofAttempt *otlptest.Span
			for _, o := range rcv.Named(tracing.SpanOutcome) {
				switch o.ParentID {
				case dec.ID:
					inOpen = &o
				case parent.SpanID().String():
					late = &o
				case att.ID:
					ofAttempt = &o
				}
			}
			if inOpen == nil || late == nil || ofAttempt == nil {
				t.Fatalf("outcomes: open %v late %v attempt %v (%+v)", inOpen, late, ofAttempt, rcv.Named(tracing.SpanOutcome))
			}
			if !inOpen.Error || inOpen.Attrs[tracing.AttrOutcomeOrigin] != "upstream" || len(inOpen.Events) != 1 ||
				inOpen.Events[0].Name != tracing.EventTransition || inOpen.Events[0].Attrs[tracing.AttrTransition] != "closed->open" ||
				inOpen.Events[0].Attrs[tracing.AttrTransitionFailures] != int64(5) {
				t.Errorf("the outcome while the decision was open: %+v", inOpen)
			}
			if late.TraceID != dec.TraceID || !slices.Contains(late.Links, dec.ID) || late.Attrs[tracing.AttrOutcomeChannel] != "access_log" {
				t.Errorf("the late outcome: %+v, want in trace %s linked to %s", late, dec.TraceID, dec.ID)
			}
		})
	}
}

func one(t *testing.T, s []otlptest.Span) otlptest.Span {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("%d spans, want 1: %+v", len(s), s)
	}
	return s[0]
}

func mustTrace(t *testing.T) trace.TraceID {
	id, err := trace.TraceIDFromHex(traceID)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

var spans = 0

func mustSpan(t *testing.T) trace.SpanID {
	spans++
	id, err := trace.SpanIDFromHex(spanID[:14] + string("0123456789abcdef"[spans%16]) + "1")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// R-TR3 across replicas: an outcome recorded where the decision's span is
// not held (an access log entry on another replica) is a child of the
// span its traceparent names, linked to it, in its trace; an unsampled
// or malformed name makes nothing.
func TestOutcomeUnderAnotherReplicasDecision(t *testing.T) {
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	tr, err := tracing.Start(context.Background(), tracing.Resolved{Protocol: "grpc", Endpoint: rcv.GRPC, ServiceName: "fusebox"}, "b")
	if err != nil {
		t.Fatal(err)
	}
	dec := trace.NewSpanContext(trace.SpanContextConfig{TraceID: mustTrace(t), SpanID: mustSpan(t), TraceFlags: trace.FlagsSampled})
	tp := tracing.Traceparent(dec)
	if tp != "00-"+traceID+"-"+dec.SpanID().String()+"-01" {
		t.Fatalf("traceparent %q", tp)
	}
	o := tracing.Outcome{End: time.Unix(1_800_000_000, 0), Route: "r", Class: "failure", Reason: "provider_5xx", Origin: "upstream", Channel: tracing.ChannelAccessLog}
	tr.OutcomeUnder(tp, o)
	tr.OutcomeUnder("00-"+traceID+"-"+dec.SpanID().String()+"-00", o) // not sampled
	tr.OutcomeUnder("garbage", o)
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := one(t, rcv.Named(tracing.SpanOutcome))
	if out.TraceID != traceID || out.ParentID != dec.SpanID().String() || !slices.Contains(out.Links, dec.SpanID().String()) {
		t.Fatalf("outcome %+v, want under and linked to %s", out, dec.SpanID())
	}
}
