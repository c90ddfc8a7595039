package processor

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// fuzzServer is one processor with a fake clock, shared by a fuzz run.
func fuzzServer(t testing.TB) (*Server, *metrics.Metrics, *breaker.FakeClock) {
	rt, err := routes.Parse([]byte(testConfig), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	clk := breaker.NewFakeClock(testT0)
	s := NewServer(Options{Config: routes.NewHolder(rt), Store: breaker.NewMemory(nil), Clock: clk, Metrics: m,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return s, m, clk
}

// streamFromBytes turns fuzz input into the messages of one stream, the
// way Envoy could send them: any phase in any order, any sizes and flags.
func streamFromBytes(b []byte) []*extprocv3.ProcessingRequest {
	next := func() byte {
		if len(b) == 0 {
			return 0
		}
		c := b[0]
		b = b[1:]
		return c
	}
	models := []string{"gpt", "cheap", "shadowed", "offm", "ff", "floor", "strict", "llama", "slowm", "mixed", "fo", "stally", "basem", "nope", "", strings.Repeat("m", 300)}
	statuses := []string{"200", "500", "503", "504", "429", "401", "400", "302", "abc", ""}
	cts := []string{"application/json", "text/event-stream", "text/plain", "", "multipart/form-data"}
	bodies := []string{`{"model":"gpt","messages":[]}`, `{"model":"llama"}`, `{"model":null}`, `{"model":"a","model":"b"}`, `{`, ``,
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", "data: [DONE]\n\n", "event: message_stop\ndata: {}\n\n",
		`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, "upstream connect error or disconnect/reset before headers", "\x00\xff\xfe"}
	var out []*extprocv3.ProcessingRequest
	n := int(next()%12) + 1
	for i := 0; i < n; i++ {
		op := next()
		eos := op&0x80 != 0
		var req *extprocv3.ProcessingRequest
		switch op % 7 {
		case 0:
			kv := []string{":method", "POST", ":path", "/v1/chat/completions", "content-type", cts[int(next())%len(cts)]}
			if next()%2 == 0 {
				kv = append(kv, "x-fusebox-model", models[int(next())%len(models)])
			}
			if next()%3 == 0 {
				kv = append(kv, "x-fusebox-gateway", []string{"default", "tenant2", "nope", ""}[next()%4])
			}
			if next()%4 == 0 {
				kv = append(kv, "x-fusebox-residency", []string{"eu", "us", "eu,us", "mars"}[next()%4])
			}
			if next()%5 == 0 {
				kv = append(kv, "x-fusebox-cluster", "evil")
			}
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...), EndOfStream: eos}}}
		case 1:
			body := bodies[int(next())%len(bodies)]
			if next()%8 == 0 {
				body = strings.Repeat(body, int(next())+1)
			}
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}}}
		case 2:
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
		case 3:
			kv := []string{":status", statuses[int(next())%len(statuses)], "content-type", cts[int(next())%len(cts)]}
			if next()%3 == 0 {
				kv = append(kv, "retry-after", []string{"5", "Wed, 21 Oct 2015 07:28:00 GMT", "-1", "99999999999"}[next()%4])
			}
			if next()%6 == 0 {
				kv = append(kv, "x-envoy-overloaded", "true")
			}
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...), EndOfStream: eos}}}
			if f := next(); f%2 == 0 {
				req.Attributes = attrs([]int{0, 0x20, 0x4, 0x80, 0x1000000, -1}[int(f/2)%6], []string{"via_upstream", "cluster_not_found", "upstream_response_timeout", ""}[int(f/12)%4])
			}
		case 4:
			body := bodies[int(next())%len(bodies)]
			cut := int(next()) % (len(body) + 1)
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body[:cut]), EndOfStream: eos}}}
		case 5:
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
		case 6:
			req = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}, Attributes: map[string]*structpb.Struct{"x": {}}}
		}
		if i == 0 {
			modes := []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_BUFFERED_PARTIAL}
			req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[next()%4], ResponseBodyMode: modes[next()%4]}
			req.MetadataContext = &corev3.Metadata{}
		}
		out = append(out, req)
	}
	return out
}

// replyKind names the reply a request needs.
func replyKind(req *extprocv3.ProcessingRequest) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", req.Request), "*ext_procv3.ProcessingRequest_")
}

func respKind(resp *extprocv3.ProcessingResponse) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", resp.Response), "*ext_procv3.ProcessingResponse_")
}

// checkReply holds one reply to what Envoy accepts (docs/ext_proc.md).
func checkReply(t *testing.T, req *extprocv3.ProcessingRequest, resp *extprocv3.ProcessingResponse) {
	t.Helper()
	if resp == nil {
		t.Fatalf("no reply to %s", replyKind(req))
	}
	if k := respKind(resp); k != replyKind(req) && k != "ImmediateResponse" {
		t.Fatalf("reply %s to %s", k, replyKind(req))
	}
	if err := resp.ValidateAll(); err != nil {
		t.Fatalf("reply fails Envoy's validation: %v", err)
	}
	var muts []*extprocv3.HeaderMutation
	if ir := resp.GetImmediateResponse(); ir != nil {
		muts = append(muts, ir.Headers)
		if len(ir.Body) > extproc.MaxErrorBody {
			t.Fatalf("error body of %d bytes", len(ir.Body))
		}
	}
	for _, c := range []*extprocv3.CommonResponse{resp.GetRequestHeaders().GetResponse(), resp.GetRequestBody().GetResponse(), resp.GetResponseHeaders().GetResponse(), resp.GetResponseBody().GetResponse()} {
		muts = append(muts, c.GetHeaderMutation())
	}
	forbidden := func(k string) bool {
		return k == "host" || k == ":authority" || k == ":method" || k == ":scheme" || strings.HasPrefix(k, "x-envoy-")
	}
	for _, m := range muts {
		for _, h := range m.GetSetHeaders() {
			if h.Header.Value != "" {
				t.Fatalf("header %s set with value (Envoy reads only raw_value)", h.Header.Key)
			}
			if forbidden(h.Header.Key) {
				t.Fatalf("mutation of %s", h.Header.Key)
			}
		}
		for _, k := range m.GetRemoveHeaders() {
			if forbidden(k) || strings.HasPrefix(k, ":") {
				t.Fatalf("removal of %s", k)
			}
		}
	}
}

// FuzzStream drives whole ext_proc streams, random in their messages,
// sizes and flags, through one server: no panic (not even a recovered
// one), one reply of the right kind per message, every reply valid for
// Envoy, raw_value only, and never a mutation of host, :authority, :method
// or x-envoy-*.
func FuzzStream(f *testing.F) {
	f.Add([]byte{4, 0, 1, 0, 0, 1, 0, 3, 0, 1, 4, 6, 200})
	f.Add([]byte{6, 0x80, 0, 0, 3, 0, 0, 0x83, 1, 0, 0, 0})
	f.Add([]byte{5, 0, 0, 1, 1, 1, 2, 0, 3, 3, 5, 5})
	f.Add([]byte("\x0b\x00\x01\x00\x01\x02\x01\x01\x03\x00\x01\x04\x04\x06\x10\x84\x07\x20\x05"))
	s, m, clk := fuzzServer(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		st := newStream(s)
		for _, req := range streamFromBytes(b) {
			resp := s.handle(st, req)
			checkReply(t, req, resp)
			if resp.GetImmediateResponse() != nil {
				break // Envoy ends the stream
			}
		}
		s.finish(st)
		clk.Advance(7e9)
		if n := testutil.ToFloat64(m.InternalErrors.WithLabelValues("panic")); n != 0 {
			t.Fatalf("%v panics recovered", n)
		}
	})
}
