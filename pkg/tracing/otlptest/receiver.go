package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, read.
type Span struct {
	Name                  string
	TraceID, ID, ParentID string // hex
	Attrs                 map[string]any
	Events                []Event
	Links                 []string // the linked spans' ids
	Service               string   // its resource's service.name
	Start, End            time.Time
	Error                 bool
}

// Event is a span event, read.
type Event struct {
	Name  string
	Attrs map[string]any
}

// Receiver keeps the spans sent to it.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	// GRPC and HTTP are the endpoints' URLs (http://127.0.0.1:port).
	GRPC, HTTP string

	mu    sync.Mutex
	spans []Span
}

// Start serves both endpoints until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(gl) }()
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(r.serveHTTP), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { gs.Stop(); _ = hs.Close() })
	r.GRPC, r.HTTP = "http://"+gl.Addr().String(), "http://"+hl.Addr().String()
	return r
}

// Export implements the OTLP gRPC trace service.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.take(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serveHTTP is OTLP/HTTP's binary protobuf encoding at /v1/traces.
func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	var m coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.take(&m)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) take(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		svc, _ := attrs(rs.GetResource().GetAttributes())["service.name"].(string)
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, read(s, svc))
			}
		}
	}
}

func read(s *tracepb.Span, svc string) Span {
	out := Span{Name: s.Name, TraceID: hex.EncodeToString(s.TraceId), ID: hex.EncodeToString(s.SpanId),
		ParentID: hex.EncodeToString(s.ParentSpanId), Attrs: attrs(s.Attributes), Service: svc,
		Start: time.Unix(0, int64(s.StartTimeUnixNano)), End: time.Unix(0, int64(s.EndTimeUnixNano)),
		Error: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR}
	for _, e := range s.Events {
		out.Events = append(out.Events, Event{Name: e.Name, Attrs: attrs(e.Attributes)})
	}
	for _, l := range s.Links {
		out.Links = append(out.Links, hex.EncodeToString(l.SpanId))
	}
	return out
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = value(kv.Value)
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.Values {
			out = append(out, value(e))
		}
		return out
	}
	return nil
}

// Spans returns what was received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Named returns the received spans called name.
func (r *Receiver) Named(name string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}
