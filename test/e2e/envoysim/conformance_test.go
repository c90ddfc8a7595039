package envoysim

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// These tests hold the proxy to docs/ext_proc.md with a scripted processor: each
// checks one fact of how Envoy treats a processor's replies. Breaking any of
// those facts in the proxy makes one of them fail.

type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	mu     sync.Mutex
	seen   []*extprocv3.ProcessingRequest
	md     []metadata.MD
	mdOf   []string // the role of each message in seen
	script func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
	// byRole, when set, answers instead of script, told the stream's
	// x-fusebox-role (the failover tests play both roles).
	byRole func(role string, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
	// ended is when each stream saw its end (Recv failed).
	ended []time.Time
}

func (s *scripted) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	md, _ := metadata.FromIncomingContext(st.Context())
	s.mu.Lock()
	s.md = append(s.md, md)
	s.mu.Unlock()
	for {
		req, err := st.Recv()
		if err != nil {
			s.mu.Lock()
			s.ended = append(s.ended, time.Now())
			s.mu.Unlock()
			return nil
		}
		s.mu.Lock()
		s.seen = append(s.seen, req)
		role := ""
		if v := md.Get("x-fusebox-role"); len(v) > 0 {
			role = v[0]
		}
		s.mdOf = append(s.mdOf, role)
		s.mu.Unlock()
		var resp *extprocv3.ProcessingResponse
		if s.byRole != nil {
			role := ""
			if v := md.Get("x-fusebox-role"); len(v) > 0 {
				role = v[0]
			}
			resp = s.byRole(role, req)
		} else {
			resp = s.script(req)
		}
		if resp == nil {
			continue
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

func (s *scripted) requests() []*extprocv3.ProcessingRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), s.seen...)
}

// plain answers every message with an empty reply of its kind.
func plain(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return nil
}

func reqHeadersReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func reqBodyReply(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

// upstream records what a cluster received.
type upstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	hits int
	last *http.Request
	body string
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.hits++
		u.last, u.body = r, string(b)
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{"data: one\n\n", "data: two\n\n", "data: [DONE]\n\n"} {
			io.WriteString(w, c)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

type rig struct {
	t       *testing.T
	proc    *scripted
	proxy   *Proxy
	def, up *upstream
}

func newRig(t *testing.T, script func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse, mod ...func(*Config)) *rig {
	t.Helper()
	r := &rig{t: t, proc: &scripted{script: script}}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, r.proc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	r.def = newUpstream(t, nil)
	r.up = newUpstream(t, nil)
	cfg := Config{
		StripPrefix: "x-fusebox-", GatewayHeader: "x-fusebox-gateway", Gateway: "gw",
		ExtProc: ExtProcConfig{
			Addr: ln.Addr().String(), RequestHeaderMode: filterv3.ProcessingMode_SEND, ResponseHeaderMode: filterv3.ProcessingMode_SEND,
			RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED,
			// Hang bounds, not the machine's speed (#54): at 300 ms and
			// 2 s, a loaded machine's late reply or slow upstream turned
			// TestRetryResource's refused retry into a 504. A test of a
			// timeout sets its own.
			AllowModeOverride: true, FailureModeAllow: false, MessageTimeout: 30 * time.Second,
			ResponseAttributes:  []string{"response.flags", "response.code_details"},
			ReceivingNamespaces: []string{"fusebox"}, InitialMetadata: map[string]string{"x-fusebox-role": "route"},
		},
		ClusterHeader: "x-fusebox-cluster", DefaultCluster: "default",
		Clusters: map[string]*Cluster{
			"default": {Addr: strings.TrimPrefix(r.def.srv.URL, "http://")},
			"chosen":  {Addr: strings.TrimPrefix(r.up.srv.URL, "http://")},
		},
		RequestHeadersToRemove: []string{"x-fusebox-cluster"},
		RouteTimeout:           30 * time.Second, RetryOn: []string{"connect-failure", "reset"}, NumRetries: 1,
		BufferLimit: 1 << 20,
	}
	for _, m := range mod {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	r.proxy = p
	return r
}

func (r *rig) post(body string, hdr ...string) (*http.Response, string) {
	r.t.Helper()
	req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/x", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// Errorf, not Fatal: tests post from goroutines of their own too,
		// where Fatal would end only that goroutine. The status 0 then
		// fails the caller's own check.
		r.t.Errorf("POST: %v", err)
		return &http.Response{Header: http.Header{}, Body: http.NoBody}, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// What the processor is sent: raw_value only, lower-case keys, pseudo
// headers, x-request-id and x-forwarded-proto; protocol_config and
// metadata_context on the first message only; the role as gRPC metadata;
// numeric response flags; one message per body chunk.
func TestWhatTheProcessorSees(t *testing.T) {
	r := newRig(t, plain)
	r.post(`{"a":1}`, "X-Client", "v")
	reqs := r.proc.requests()
	if len(reqs) < 5 {
		t.Fatalf("%d messages", len(reqs))
	}
	if reqs[0].ProtocolConfig == nil || reqs[0].MetadataContext == nil || reqs[1].ProtocolConfig != nil {
		t.Fatal("protocol_config/metadata_context must come with the first message only")
	}
	hs := reqs[0].GetRequestHeaders().GetHeaders().GetHeaders()
	keys := map[string]string{}
	for _, h := range hs {
		if h.Value != "" {
			t.Fatalf("header %s carries value; Envoy sends raw_value", h.Key)
		}
		if h.Key != strings.ToLower(h.Key) {
			t.Fatalf("key %q not lower case", h.Key)
		}
		keys[h.Key] = string(h.RawValue)
	}
	for _, k := range []string{":path", ":method", ":authority", ":scheme", "x-request-id", "x-forwarded-proto", "x-client"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("processor did not see %s", k)
		}
	}
	if keys["x-fusebox-gateway"] != "gw" {
		t.Error("header_mutation did not set the gateway")
	}
	if b := reqs[1].GetRequestBody(); b == nil || string(b.Body) != `{"a":1}` || !b.EndOfStream {
		t.Fatalf("buffered body: %v", reqs[1])
	}
	rh := reqs[2]
	f := rh.Attributes[attrKey].GetFields()
	if _, ok := f["response.flags"].GetKind().(*structpb.Value_NumberValue); !ok || f["response.code_details"].GetStringValue() != "via_upstream" {
		t.Fatalf("attributes %v", rh.Attributes)
	}
	chunks := 0
	for _, q := range reqs[3:] {
		if q.GetResponseBody() != nil {
			chunks++
		}
	}
	if chunks < 2 {
		t.Fatalf("%d body messages: streamed bodies arrive chunk by chunk", chunks)
	}
	r.proc.mu.Lock()
	role := r.proc.md[0].Get("x-fusebox-role")
	r.proc.mu.Unlock()
	if len(role) != 1 || role[0] != "route" {
		t.Fatalf("role metadata %v", role)
	}
}

// Only raw_value is read: value alone writes an empty header; both is a 500.
func TestRawValueOnly(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-only-value", Value: "v"}},
			}}})
		}
		return plain(req)
	})
	r.post(`{}`)
	if v, ok := r.def.last.Header["X-Only-Value"]; !ok || v[0] != "" {
		t.Fatalf("value-only header must arrive empty, got %v %v", v, ok)
	}
	r2 := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "x-both", Value: "v", RawValue: []byte("v")}},
			}}})
		}
		return plain(req)
	})
	if resp, _ := r2.post(`{}`); resp.StatusCode != 500 {
		t.Fatalf("value and raw_value: %d", resp.StatusCode)
	}
}

// clear_route_cache re-routes only with a header_mutation in the same reply,
// only on the request path.
func TestClearRouteCache(t *testing.T) {
	cases := []struct {
		name   string
		script func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		want   string // "chosen" or "default"
	}{
		{"headers reply with mutation", func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if req.GetRequestHeaders() != nil {
				return reqHeadersReply(&extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
			}
			return plain(req)
		}, "chosen"},
		{"buffered body reply with mutation", func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if req.GetRequestBody() != nil {
				return reqBodyReply(&extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
			}
			return plain(req)
		}, "chosen"},
		{"header set without clear_route_cache", func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if req.GetRequestHeaders() != nil {
				return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
			}
			return plain(req)
		}, "default"},
		{"clear_route_cache without a mutation", func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if req.GetRequestHeaders() != nil {
				return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
			}
			if req.GetRequestBody() != nil {
				return reqBodyReply(&extprocv3.CommonResponse{ClearRouteCache: true})
			}
			return plain(req)
		}, "default"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.script)
			r.post(`{}`)
			got := "default"
			if r.up.hits > 0 {
				got = "chosen"
			}
			if got != tc.want {
				t.Fatalf("routed to %s, want %s", got, tc.want)
			}
			if tc.want == "chosen" {
				if r.up.last.Header.Get("x-fusebox-cluster") != "" {
					t.Fatal("request_headers_to_remove not applied")
				}
			}
		})
	}
}

// A client's own cluster header is stripped before the route is computed.
func TestClientClusterHeaderStripped(t *testing.T) {
	r := newRig(t, plain)
	r.post(`{}`, "x-fusebox-cluster", "chosen")
	if r.up.hits != 0 {
		t.Fatal("the client chose the cluster")
	}
}

// mode_override is honoured in a headers reply only, taken literally.
func TestModeOverride(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetResponseHeaders() != nil {
			resp := plain(req)
			resp.ModeOverride = &filterv3.ProcessingMode{ResponseHeaderMode: filterv3.ProcessingMode_SEND} // body mode omitted = NONE
			return resp
		}
		return plain(req)
	})
	_, body := r.post(`{}`)
	for _, q := range r.proc.requests() {
		if q.GetResponseBody() != nil {
			t.Fatal("an omitted body mode must mean NONE")
		}
	}
	if !strings.Contains(body, "[DONE]") {
		t.Fatalf("body lost: %q", body)
	}
	// In a body reply it is ignored.
	r2 := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		resp := plain(req)
		if req.GetRequestBody() != nil {
			resp.ModeOverride = &filterv3.ProcessingMode{}
		}
		return resp
	})
	r2.post(`{}`)
	n := 0
	for _, q := range r2.proc.requests() {
		if q.GetResponseBody() != nil {
			n++
		}
	}
	if n == 0 {
		t.Fatal("mode_override in a body reply was honoured")
	}
	// Not honoured at all without allow_mode_override.
	r3 := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		resp := plain(req)
		if req.GetRequestHeaders() != nil {
			resp.ModeOverride = &filterv3.ProcessingMode{}
		}
		return resp
	}, func(c *Config) { c.ExtProc.AllowModeOverride = false })
	r3.post(`{}`)
	if len(r3.proc.requests()) < 4 {
		t.Fatal("mode_override honoured without allow_mode_override")
	}
}

// A reply of the wrong kind is spurious: 500, or unprocessed continuation
// with failure_mode_allow.
func TestSpuriousReply(t *testing.T) {
	wrong := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		}
		return plain(req)
	}
	if resp, _ := newRig(t, wrong).post(`{}`); resp.StatusCode != 500 {
		t.Fatalf("%d", resp.StatusCode)
	}
	r := newRig(t, wrong, func(c *Config) { c.ExtProc.FailureModeAllow = true })
	if resp, _ := r.post(`{}`); resp.StatusCode != 200 || r.def.hits != 1 {
		t.Fatalf("failure_mode_allow: %d", resp.StatusCode)
	}
	if r.proxy.Stats().Get("spurious_msgs_received") != 1 {
		t.Fatal("not counted")
	}
}

// The message timeout: 504, or unprocessed continuation with
// failure_mode_allow (the stream is closed, nothing more is sent).
func TestMessageTimeout(t *testing.T) {
	slow := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestBody() != nil {
			time.Sleep(600 * time.Millisecond)
		}
		return plain(req)
	}
	short := func(c *Config) { c.ExtProc.MessageTimeout = 300 * time.Millisecond }
	if resp, _ := newRig(t, slow, short).post(`{}`); resp.StatusCode != 504 {
		t.Fatalf("%d", resp.StatusCode)
	}
	r := newRig(t, slow, short, func(c *Config) { c.ExtProc.FailureModeAllow = true })
	if resp, _ := r.post(`{}`); resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	for _, q := range r.proc.requests() {
		if q.GetResponseHeaders() != nil {
			t.Fatal("messages were sent after the timeout")
		}
	}
}

// The processor unreachable: with failure_mode_allow the request continues
// unprocessed; without it, 500.
func TestProcessorDown(t *testing.T) {
	r := newRig(t, plain, func(c *Config) { c.ExtProc.Addr = "127.0.0.1:1"; c.ExtProc.FailureModeAllow = true })
	if resp, _ := r.post(`{}`); resp.StatusCode != 200 || r.def.hits != 1 {
		t.Fatalf("%d", resp.StatusCode)
	}
	r2 := newRig(t, plain, func(c *Config) { c.ExtProc.Addr = "127.0.0.1:1" })
	if resp, _ := r2.post(`{}`); resp.StatusCode != 500 {
		t.Fatalf("%d", resp.StatusCode)
	}
}

// An immediate response is sent as is (status < 200 becomes 200) and is not
// sent back through the processor.
func TestImmediateResponse(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_Continue}, Body: []byte("x"),
			}}}
		}
		return plain(req)
	})
	resp, body := r.post(`{}`)
	if resp.StatusCode != 200 || body != "x" || r.def.hits != 0 {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if len(r.proc.requests()) != 1 {
		t.Fatal("the local reply went back through the processor")
	}
}

// A replaced body whose length differs from content-length fails with 500
// unless the processor sets or removes it.
func TestReplacedBodyContentLength(t *testing.T) {
	replace := func(setCL bool) func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		return func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if req.GetRequestBody() != nil {
				cr := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(`{"longer":true}`)}}}
				if setCL {
					cr.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("content-length", "15")}}
				}
				return reqBodyReply(cr)
			}
			return plain(req)
		}
	}
	if resp, _ := newRig(t, replace(false)).post(`{}`); resp.StatusCode != 500 {
		t.Fatalf("%d", resp.StatusCode)
	}
	r := newRig(t, replace(true))
	if resp, _ := r.post(`{}`); resp.StatusCode != 200 || r.def.body != `{"longer":true}` {
		t.Fatalf("%d %q", resp.StatusCode, r.def.body)
	}
}

// Mutation rules: host, :authority, :method and x-envoy-* are kept; the
// append flag appends; append_action is ignored; invalid values fail.
func TestMutationRules(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{
					set(":method", "DELETE"), set("x-envoy-foo", "1"), set(":path", "/rewritten"),
					set("x-client", "overwritten"),
					{Header: &corev3.HeaderValue{Key: "x-multi", RawValue: []byte("b")}, Append: wrapperspb.Bool(true)},
					{Header: &corev3.HeaderValue{Key: "x-action", RawValue: []byte("new")}, AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD},
				},
				RemoveHeaders: []string{":authority", "host"},
			}})
		}
		return plain(req)
	})
	r.post(`{}`, "x-client", "orig", "x-multi", "a", "x-action", "old")
	last := r.def.last
	if last.Method != "POST" || last.URL.Path != "/rewritten" || last.Header.Get("x-envoy-foo") != "" {
		t.Fatalf("method %s path %s x-envoy-foo %q", last.Method, last.URL.Path, last.Header.Get("x-envoy-foo"))
	}
	if last.Header.Get("x-client") != "overwritten" || len(last.Header.Values("x-multi")) != 2 || last.Header.Values("x-action")[0] != "new" || len(last.Header.Values("x-action")) != 1 {
		t.Fatalf("headers %v", last.Header)
	}
	if r.proxy.Stats().Get("rejected_header_mutations") != 4 {
		t.Fatalf("rejected %d", r.proxy.Stats().Get("rejected_header_mutations"))
	}
	bad := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-bad", "a\r\nb")}}})
		}
		return plain(req)
	}, func(c *Config) { c.ExtProc.FailureModeAllow = true })
	if resp, _ := bad.post(`{}`); resp.StatusCode != 500 {
		t.Fatalf("invalid characters must fail even with failure_mode_allow: %d", resp.StatusCode)
	}
}

// Envoy's own local replies (here a connect failure after one retry) go
// through the processor's response path with numeric flags.
func TestLocalRepliesThroughResponsePath(t *testing.T) {
	r := newRig(t, plain, func(c *Config) { c.Clusters["default"].Addr = "127.0.0.1:1" })
	resp, body := r.post(`{}`)
	if resp.StatusCode != 503 || !strings.Contains(body, "upstream connect error or disconnect/reset before headers. reset reason: connection failure") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	var rh *extprocv3.ProcessingRequest
	for _, q := range r.proc.requests() {
		if q.GetResponseHeaders() != nil {
			rh = q
		}
	}
	if rh == nil {
		t.Fatal("the local reply did not go through the processor")
	}
	f := rh.Attributes[attrKey].GetFields()
	if uint64(f["response.flags"].GetNumberValue()) != flagUF|flagURX ||
		f["response.code_details"].GetStringValue() != "upstream_reset_before_response_started{remote_connection_failure}" {
		t.Fatalf("attributes %v", f)
	}
	if r.proxy.Stats().Get("upstream_rq_retry") != 1 {
		t.Fatal("connect-failure not retried once")
	}
	// Unknown cluster: 503 NC.
	r2 := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "nope")}}})
		}
		return plain(req)
	})
	if resp, _ := r2.post(`{}`); resp.StatusCode != 503 || r2.proxy.Log()[0].Flags != flagNC {
		t.Fatalf("%d", resp.StatusCode)
	}
}

// The client going away ends the processor's stream without end_of_stream.
func TestClientCancelEndsStream(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, plain)
	r.up = nil
	r.def.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-release
	})
	defer close(release)
	req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/x", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	resp.Body.Read(buf)
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	var entry Entry
	for {
		if e := r.proxy.Log(); len(e) == 1 {
			entry = e[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, q := range r.proc.requests() {
		if b := q.GetResponseBody(); b != nil && b.EndOfStream {
			t.Fatal("end_of_stream sent after a client cancel")
		}
	}
	// The entry says the client went away (DC: an HTTP/1 client's
	// connection, conn_manager_impl.cc onResetStream) and keeps the
	// upstream's status. Before, envoysim set no flag: the shipped filter
	// logged nothing, and fusebox never learnt what broke the answer.
	if entry.Flags != flagDC || entry.Status != 200 || !entry.Reset {
		t.Fatalf("entry flags %#x status %d reset %v, want DC 200", entry.Flags, entry.Status, entry.Reset)
	}
}

// The upstream resetting an answer that had begun: the downstream stream is
// reset, the processor sees no end_of_stream, and the entry says UR with
// the upstream's status (router.cc onUpstreamReset, response started).
// Before, envoysim set no flag.
func TestUpstreamResetMidAnswer(t *testing.T) {
	r := newRig(t, plain)
	r.def.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the upstream resets its stream
	})
	req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/x", strings.NewReader(`{}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(r.proxy.Log()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("request never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if e := r.proxy.Log()[0]; e.Flags != flagUR || e.Status != 200 || !e.Reset {
		t.Fatalf("entry flags %#x status %d reset %v, want UR 200", e.Flags, e.Status, e.Reset)
	}
	for _, q := range r.proc.requests() {
		if b := q.GetResponseBody(); b != nil && b.EndOfStream {
			t.Fatal("end_of_stream sent after an upstream reset")
		}
	}
}

// STREAMED bodies run under one message timer per direction
// (processor_state.cc): every chunk sent re-arms it, every reply disables
// it. All chunks sent at once, the first answered at once and the rest slowly
// (each reply later than the timeout after its own chunk): no timeout, since
// nothing was sent after the first reply. A processor that answers nothing
// meets the timer armed by the last send. Before, envoysim gave each chunk
// its own deadline and timed out the first case.
func TestStreamedMessageTimerPerDirection(t *testing.T) {
	chunk := strings.Repeat("x", chunkSize)
	cases := []struct {
		name     string
		first    time.Duration // the first body reply's delay
		rest     time.Duration // every later one's
		timeouts bool
	}{
		{"slow after the first reply", 50 * time.Millisecond, 500 * time.Millisecond, false},
		{"never answered in time", time.Second, time.Second, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			bodies := 0
			r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if req.GetResponseBody() != nil {
					mu.Lock()
					bodies++
					n := bodies
					mu.Unlock()
					if n == 1 {
						time.Sleep(tc.first)
					} else {
						time.Sleep(tc.rest)
					}
				}
				return plain(req)
			}, func(c *Config) { c.ExtProc.MessageTimeout = 250 * time.Millisecond })
			r.up = newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for i := 0; i < 3; i++ {
					io.WriteString(w, chunk)
					w.(http.Flusher).Flush()
				}
			})
			// The plain processor routes nothing: the default route serves.
			r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(r.up.srv.URL, "http://")
			_, body := r.post(`{"model":"m"}`)
			got := r.proxy.Stats().Get("message_timeouts") > 0
			if got != tc.timeouts {
				t.Fatalf("message timeouts %v, want %v (%d bytes through)", got, tc.timeouts, len(body))
			}
			if !tc.timeouts && len(body) != 3*chunkSize {
				t.Fatalf("%d bytes through, want %d", len(body), 3*chunkSize)
			}
		})
	}
}

// A response that ends with trailers (processor_state.cc): in trailer mode
// SKIP no body message carries end_of_stream, the trailers ended the
// stream; in SEND the processor is sent the trailers instead. The client
// gets them either way. Before, envoysim always sent a body end.
func TestResponseTrailers(t *testing.T) {
	for _, mode := range []filterv3.ProcessingMode_HeaderSendMode{filterv3.ProcessingMode_SKIP, filterv3.ProcessingMode_SEND} {
		t.Run(mode.String(), func(t *testing.T) {
			r := newRig(t, plain, func(c *Config) { c.ExtProc.ResponseTrailerMode = mode })
			r.up = newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Trailer", "X-Upstream-Done")
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				io.WriteString(w, "data: [DONE]\n\n")
				w.Header().Set("X-Upstream-Done", "1")
			})
			r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(r.up.srv.URL, "http://")
			resp, body := r.post(`{"model":"m"}`)
			if resp.StatusCode != 200 || body != "data: one\n\ndata: [DONE]\n\n" || resp.Trailer.Get("X-Upstream-Done") != "1" {
				t.Fatalf("%d %q trailers %v", resp.StatusCode, body, resp.Trailer)
			}
			r.proc.mu.Lock()
			defer r.proc.mu.Unlock()
			eos, trailers := false, false
			for _, m := range r.proc.seen {
				eos = eos || m.GetResponseBody().GetEndOfStream()
				trailers = trailers || m.GetResponseTrailers() != nil
			}
			if eos || trailers != (mode == filterv3.ProcessingMode_SEND) {
				t.Fatalf("body end_of_stream sent %v, trailers sent %v", eos, trailers)
			}
		})
	}
}

// Connection failures are counted as Envoy's connection pool counts them
// (conn_pool_base.cc, onConnectionEvent and purgePendingRequests):
// cluster.<name>.upstream_cx_connect_fail for each connection that failed
// while connecting, and cluster.<name>.upstream_rq_pending_failure_eject
// for each request such a failure failed, the retried attempt's included.
// envoysim dials a connection per attempt, so both count attempts here.
func TestConnectFailureStats(t *testing.T) {
	refused := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}()
	toChosen := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
		}
		return plain(req)
	}
	r := newRig(t, toChosen, func(c *Config) { c.Clusters["chosen"].Addr = refused })
	for range 2 {
		if resp, _ := r.post(`{}`); resp.StatusCode != 503 {
			t.Fatalf("a refused cluster answered %d, want 503 (UF)", resp.StatusCode)
		}
	}
	st := r.proxy.Stats()
	// Two requests, each tried twice (num_retries 1 on connect-failure).
	if got := st.Get("cluster.chosen.upstream_rq_pending_failure_eject"); got != 4 {
		t.Fatalf("upstream_rq_pending_failure_eject %d, want 4 (each attempt)", got)
	}
	if got := st.Get("cluster.chosen.upstream_cx_connect_fail"); got < 1 || got > 4 {
		t.Fatalf("upstream_cx_connect_fail %d, want 1..4 (one a failed connection)", got)
	}
	if got := st.Get("cluster.default.upstream_rq_pending_failure_eject"); got != 0 {
		t.Fatalf("another cluster counted %d", got)
	}
}
