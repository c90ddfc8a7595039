package processor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// nullServer answers CONTINUE to everything: the baseline.
type nullServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (nullServer) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	return passThrough(s, nil)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchLifecycle is one request as Envoy sends it with the shipped modes:
// headers, an 8 KiB buffered body, response headers, 50 streamed chunks.
type benchLifecycle struct {
	reqHeaders, reqBody, respHeaders *extprocv3.ProcessingRequest
	chunks                           []*extprocv3.ProcessingRequest
}

func newLifecycle() *benchLifecycle {
	var sb strings.Builder
	sb.WriteString(`{"model":"gpt","stream":true,"messages":[`)
	for sb.Len() < 8<<10-64 {
		sb.WriteString(`{"role":"user","content":"Lorem ipsum dolor sit amet, consectetur adipiscing"},`)
	}
	sb.WriteString(`{"role":"user","content":"end"}]}`)
	l := &benchLifecycle{
		reqHeaders: &extprocv3.ProcessingRequest{
			ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED},
			MetadataContext: &corev3.Metadata{},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(
				":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw.local", ":scheme", "https",
				"content-type", "application/json", "x-request-id", "0f7c", "x-forwarded-proto", "https",
				"x-fusebox-gateway", "default", "authorization", "Bearer sk-redacted", "user-agent", "bench")}},
		},
		reqBody: &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(sb.String()), EndOfStream: true}}},
		respHeaders: &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(
				":status", "200", "content-type", "text/event-stream", "x-request-id", "0f7c")}},
			Attributes: attrs(0, "via_upstream"),
		},
	}
	for i := 0; i < 50; i++ {
		chunk := fmt.Sprintf("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token %d \"}}]}\n\n", i)
		if i == 49 {
			chunk = "data: [DONE]\n\n"
		}
		l.chunks = append(l.chunks, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: i == 49}}})
	}
	return l
}

func (l *benchLifecycle) run(b *testing.B, client extprocv3.ExternalProcessorClient) {
	l.runCtx(b, context.Background(), client)
}

// runCtx is run with the stream's context (its metadata: Envoy's trace).
func (l *benchLifecycle) runCtx(b *testing.B, ctx context.Context, client extprocv3.ExternalProcessorClient) {
	s, err := client.Process(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range []*extprocv3.ProcessingRequest{l.reqHeaders, l.reqBody, l.respHeaders} {
		if err := s.Send(m); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	// Envoy does not wait for each chunk's reply: pipeline them.
	for _, m := range l.chunks {
		if err := s.Send(m); err != nil {
			b.Fatal(err)
		}
	}
	for range l.chunks {
		if _, err := s.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	_ = s.CloseSend()
	if _, err := s.Recv(); err != io.EOF {
		b.Fatal(err)
	}
}

func benchServer(b *testing.B, srv extprocv3.ExternalProcessorServer) extprocv3.ExternalProcessorClient {
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go gs.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(); gs.Stop() })
	return extprocv3.NewExternalProcessorClient(conn)
}

func fuseboxBenchServer(b *testing.B, opts ...func(*Options)) *Server {
	return fuseboxBenchServerOn(b, testConfig, opts...)
}

func fuseboxBenchServerOn(b *testing.B, config string, opts ...func(*Options)) *Server {
	rt, err := routes.Parse([]byte(config), routes.Options{})
	if err != nil {
		b.Fatal(err)
	}
	clk := breaker.NewCoarseClock(time.Millisecond)
	b.Cleanup(clk.Stop)
	o := Options{Config: routes.NewHolder(rt), Store: breaker.NewMemory(nil), Clock: clk,
		Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	return NewServer(o)
}

// BenchmarkLifecycle compares one full request through fusebox with the
// same request through a null server, in the same run. cpu-ns/op is the
// process's CPU time (client and server) per request.
func BenchmarkLifecycle(b *testing.B) {
	l := newLifecycle()
	for _, tc := range []struct {
		name string
		srv  func(b *testing.B) extprocv3.ExternalProcessorServer
	}{
		{"null", func(b *testing.B) extprocv3.ExternalProcessorServer { return nullServer{} }},
		{"fusebox", func(b *testing.B) extprocv3.ExternalProcessorServer { return fuseboxBenchServer(b) }},
		// Request faults off (R-FD4): what the request's fingerprint (a
		// keyed hash of the 8 KiB body) costs, in the same run.
		{"fusebox-no-request-faults", func(b *testing.B) extprocv3.ExternalProcessorServer {
			return fuseboxBenchServerOn(b, strings.Replace(testConfig, "base: {enabled: true,", "base: {enabled: true, request_fault_ttl_sec: 0,", 1))
		}},
		// With the stream lifetime bounds (R-L13), as mainlib runs it: the
		// cost of the serving goroutine and the watch per stream.
		{"fusebox-bounded", func(b *testing.B) extprocv3.ExternalProcessorServer {
			return fuseboxBenchServer(b, func(o *Options) { o.StreamIdle, o.StreamDuration = 360*time.Second, time.Hour })
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := benchServer(b, tc.srv(b))
			l.run(b, client) // warm up the connection
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpuTime()
			for b.Loop() {
				l.run(b, client)
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
		})
	}
}
