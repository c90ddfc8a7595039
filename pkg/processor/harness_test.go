package processor

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/grpcwire"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

var testT0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const testConfig = `
policies:
  base: {enabled: true, failure_threshold: 2, window_sec: 60, cooldown_ms: 10000}
fleets:
  - name: gpu
    circuit_breaker: {enabled: true, failure_threshold: 2, failure_status_codes: [429, 500]}
gateways:
  - id: default
    circuit_breaker: {policy: base}
    models:
      - name: gpt
        routes: ["openai:us:gpt", "azure:eu:gpt", "openai:eu:gpt"]
      - name: cheap
        order: cheapest
        routes: ["openai:us:gpt", "azure:eu:gpt", "openai:eu:gpt"]
      - name: shadowed
        routes: ["openai:us:sh", "azure:eu:sh"]
        circuit_breaker: {mode: shadow}
      - name: offm
        routes: ["openai:us:off", "azure:eu:off"]
        circuit_breaker: {mode: off}
      - name: ff
        routes: ["openai:us:ff", "azure:eu:ff"]
        circuit_breaker: {when_all_open: fail_fast}
      - name: floor
        routes: ["openai:us:fl", "azure:eu:fl"]
        circuit_breaker: {max_ejection_percent: 50}
      - name: strict
        routes: ["openai:us:st", "azure:eu:st"]
        circuit_breaker: {failure_status_codes: [], open_on_status_codes: [401]}
      - name: llama
        routes: ["self:a:llama", "self:b:llama"]
      - name: slowm
        routes: ["openai:us:slow", "azure:eu:slow"]
        circuit_breaker: {slow_call_ms: 1000, slow_call_rate_percent: 50, minimum_requests: 2, failure_threshold: 100}
      - name: mixed
        routes: ["openai:us:mx", "azure:eu:mx"]
      - name: fo
        routes: ["openai:us:gpt", "azure:eu:gpt", "openai:eu:gpt"]
        failover: {max_attempts: 2}
      - name: fo3
        routes: ["openai:us:gpt", "azure:eu:gpt", "openai:eu:gpt"]
        failover: {max_attempts: 3}
      - name: stally
        routes: ["openai:us:stl", "azure:eu:stl"]
        circuit_breaker: {stall_ms: 5000, slow_call_rate_percent: 60, minimum_requests: 2, failure_threshold: 100}
      - name: basem
        routes: ["openai:us:bas", "azure:eu:bas"]
        circuit_breaker: {slow_call_baseline_multiplier: 2, slow_call_rate_percent: 50, minimum_requests: 6, rate_window_sec: 10, failure_threshold: 100}
    routes:
      - {key: "openai:us:gpt", cluster: c_openai_us, cost_per_mtok: 5, residency: [us]}
      - {key: "azure:eu:gpt", cluster: c_azure_eu, cost_per_mtok: 1, residency: [eu], upstream_model: gpt-deploy, path: "/openai/deployments/gpt/chat/completions?api-version=2024-10-21"}
      - {key: "openai:eu:gpt", cluster: c_openai_eu, cost_per_mtok: 3, residency: [eu]}
      - {key: "openai:us:sh", cluster: c_sh1}
      - {key: "azure:eu:sh", cluster: c_sh2}
      - {key: "openai:us:off", cluster: c_off1}
      - {key: "azure:eu:off", cluster: c_off2}
      - {key: "openai:us:ff", cluster: c_ff1}
      - {key: "azure:eu:ff", cluster: c_ff2}
      - {key: "openai:us:fl", cluster: c_fl1}
      - {key: "azure:eu:fl", cluster: c_fl2}
      - {key: "openai:us:st", cluster: c_st1}
      - {key: "azure:eu:st", cluster: c_st2}
      - {key: "openai:us:slow", cluster: c_slow1}
      - {key: "azure:eu:slow", cluster: c_slow2}
      - {key: "openai:us:stl", cluster: c_stl1}
      - {key: "azure:eu:stl", cluster: c_stl2}
      - {key: "openai:us:bas", cluster: c_bas1}
      - {key: "azure:eu:bas", cluster: c_bas2}
      - {key: "openai:us:mx", cluster: c_mx1, circuit_breaker: {mode: shadow, failure_threshold: 1}}
      - {key: "azure:eu:mx", cluster: c_mx2}
      - {key: "self:a:llama", cluster: c_llama_a, fleet: gpu, self_hosted: true}
      - {key: "self:b:llama", cluster: c_llama_b, fleet: gpu, self_hosted: true}
  - id: tenant2
    circuit_breaker: {enabled: true}
    models:
      - {name: gpt, routes: ["openai:us:gpt", "azure:eu:gpt"]}
    routes:
      - {key: "openai:us:gpt", cluster: t2_openai}
      - {key: "azure:eu:gpt", cluster: t2_azure}
`

// env is a fusebox processor behind a real gRPC listener, with a fake clock.
type env struct {
	t       *testing.T
	srv     *Server
	clk     *breaker.FakeClock
	store   *breaker.Memory
	metrics *metrics.Metrics
	holder  *routes.Holder
	client  extprocv3.ExternalProcessorClient
	al      accesslogv3.AccessLogServiceClient
	events  chan breaker.Event
	// pace spaces the observer's chunks (observeWith), as an upstream
	// streams them; 0: back to back.
	pace time.Duration
	// traceparent, when set, is sent on every stream (Envoy's tracer).
	traceparent string
}

func newEnv(t *testing.T, opts ...func(*Options)) *env {
	t.Helper()
	return newEnvConfig(t, testConfig, opts...)
}

// newFailoverEnv is the failover deployment (envoy.failover: true): the
// attempt role records every attempt (R-X8).
func newFailoverEnv(t *testing.T, opts ...func(*Options)) *env {
	t.Helper()
	return newEnvConfig(t, "envoy: {failover: true}\n"+testConfig, opts...)
}

func newEnvConfig(t *testing.T, config string, opts ...func(*Options)) *env {
	t.Helper()
	return newEnvOn(t, config, false, opts...)
}

// newEnvOn is newEnvConfig on grpc-go's server, or with wire on fusebox's
// own transport (grpcwire, the default of mainlib).
func newEnvOn(t *testing.T, config string, wire bool, opts ...func(*Options)) *env {
	t.Helper()
	rt, err := routes.Parse([]byte(config), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, clk: breaker.NewFakeClock(testT0), metrics: metrics.New(), holder: routes.NewHolder(rt), events: make(chan breaker.Event, 100)}
	e.store = breaker.NewMemory(func(ev breaker.Event) {
		if e.srv != nil {
			e.srv.OnTransition(ev) // mainlib's reporter does (traces)
		}
		select {
		case e.events <- ev:
		default:
		}
	})
	o := Options{Config: e.holder, Store: e.store, Clock: e.clk, Metrics: e.metrics, TokenKey: []byte("the test fleet key"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	e.srv = NewServer(o)
	var gs interface {
		grpc.ServiceRegistrar
		Serve(net.Listener) error
		Stop()
	} = grpc.NewServer()
	if wire || allOnWire {
		gs = grpcwire.NewServer(grpcwire.Options{Codec: extproc.Codec{}, MaxRecvMsgSizeFor: extproc.RecvBounds()})
	}
	extprocv3.RegisterExternalProcessorServer(gs, e.srv)
	accesslogv3.RegisterAccessLogServiceServer(gs, e.srv.AccessLogService())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop() })
	e.client = extprocv3.NewExternalProcessorClient(conn)
	e.al = accesslogv3.NewAccessLogServiceClient(conn)
	return e
}

// call is one ext_proc stream, driven as Envoy drives it.
type call struct {
	e      *env
	stream extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	first  bool
	// respMode is the response body mode the stream's protocol_config
	// announces (the shipped envoy.yaml: STREAMED).
	respMode filterv3.ProcessingMode_BodySendMode
}

func (e *env) open(role string) *call {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if role != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, RoleHeader, role)
	}
	if e.traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", e.traceparent)
	}
	s, err := e.client.Process(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return &call{e: e, stream: s, cancel: cancel, first: true, respMode: filterv3.ProcessingMode_STREAMED}
}

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// send sends one message; the first carries protocol_config as Envoy does
// (request body BUFFERED, response body STREAMED: the shipped deployment).
func (c *call) send(req *extprocv3.ProcessingRequest) {
	c.e.t.Helper()
	if c.first {
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode: c.respMode,
		}
		req.MetadataContext = &corev3.Metadata{}
		c.first = false
	}
	if err := c.stream.Send(req); err != nil {
		c.e.t.Fatalf("send: %v", err)
	}
}

func (c *call) recv() *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	resp, err := c.stream.Recv()
	if err != nil {
		c.e.t.Fatalf("recv: %v", err)
	}
	return resp
}

func (c *call) reqHeaders(eos bool, kv ...string) *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	all := append([]string{":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw.local", ":scheme", "https",
		"x-request-id", "r-1", "x-forwarded-proto", "https"}, kv...)
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(all...), EndOfStream: eos}}})
	return c.recv()
}

func (c *call) reqBody(body string) *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
	return c.recv()
}

// chat runs the request phase for a JSON chat body and returns the reply
// that carries the decision.
func (c *call) chat(model string, kv ...string) *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	r := c.reqHeaders(false, append([]string{"content-type", "application/json"}, kv...)...)
	if r.GetRequestHeaders() == nil {
		return r
	}
	return c.reqBody(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)
}

// attrs builds the response attributes Envoy sends (ints become numbers).
func attrs(flags int, details string) map[string]*structpb.Struct {
	f := map[string]*structpb.Value{}
	if flags >= 0 {
		f["response.flags"] = structpb.NewNumberValue(float64(flags))
	}
	if details != "" {
		f["response.code_details"] = structpb.NewStringValue(details)
	}
	return map[string]*structpb.Struct{extproc.AttrKey: {Fields: f}}
}

func (c *call) respHeaders(status string, eos bool, a map[string]*structpb.Struct, kv ...string) *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	c.send(&extprocv3.ProcessingRequest{
		Request:    &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(append([]string{":status", status}, kv...)...), EndOfStream: eos}},
		Attributes: a,
	})
	return c.recv()
}

func (c *call) respBody(chunk string, eos bool) *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: eos}}})
	return c.recv()
}

// end half-closes and waits for the server to finish, as Envoy does.
func (c *call) end() {
	c.e.t.Helper()
	_ = c.stream.CloseSend()
	if _, err := c.stream.Recv(); err != io.EOF {
		c.e.t.Fatalf("want EOF after close, got %v", err)
	}
	c.cancel()
}

// roundTrip runs a whole request that gets status and (for 2xx) a clean body.
func (e *env) roundTrip(model, status string, a map[string]*structpb.Struct, kv ...string) (decision *extprocv3.ProcessingResponse) {
	e.t.Helper()
	c := e.open("")
	decision = c.chat(model)
	if decision.GetImmediateResponse() != nil {
		c.end()
		return decision
	}
	eos := !strings.HasPrefix(status, "2")
	c.respHeaders(status, false, a, append([]string{"content-type", "application/json"}, kv...)...)
	if !eos {
		c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	}
	c.end()
	return decision
}

// headerSet returns the value set for key in a CommonResponse, failing when
// the mutation uses value instead of raw_value.
func headerSet(t *testing.T, cr *extprocv3.CommonResponse, key string) (string, bool) {
	t.Helper()
	if cr == nil || cr.HeaderMutation == nil {
		return "", false
	}
	for _, h := range cr.HeaderMutation.SetHeaders {
		if h.Header.Value != "" {
			t.Fatalf("header %q set with value (Envoy reads raw_value only)", h.Header.Key)
		}
		if h.Header.Key == key {
			return string(h.Header.RawValue), true
		}
	}
	return "", false
}

func common(r *extprocv3.ProcessingResponse) *extprocv3.CommonResponse {
	switch x := r.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return x.RequestHeaders.Response
	case *extprocv3.ProcessingResponse_RequestBody:
		return x.RequestBody.Response
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return x.ResponseHeaders.Response
	case *extprocv3.ProcessingResponse_ResponseBody:
		return x.ResponseBody.Response
	}
	return nil
}

func (e *env) status(gw, route string) breaker.Status {
	e.t.Helper()
	s, err := e.store.Status(context.Background(), breaker.KeyOf(breaker.RouteID(gw, route)), e.clk.Now().UnixNano())
	if err != nil {
		e.t.Fatalf("status of %s: %v", route, err)
	}
	return s
}

// openRoute opens a route breaker by recording failures through the store.
func (e *env) openRoute(gw, route string) {
	e.t.Helper()
	k := breaker.KeyOf(breaker.RouteID(gw, route))
	now := e.clk.Now().UnixNano()
	ctx := context.Background()
	for i := 0; i < 20 && e.status(gw, route).State != "open"; i++ {
		adm, _, _ := e.store.Acquire(ctx, k, now, true)
		_, _ = e.store.Record(ctx, k, now, adm, breaker.Result{Kind: breaker.KindConnError, Status: 503})
	}
	if e.status(gw, route).State != "open" {
		e.t.Fatalf("could not open %s", route)
	}
}

// forceOpen pins a route open through the store, as the admin API does.
func (e *env) forceOpen(gw, route string) {
	e.t.Helper()
	if err := e.store.ForceOpen(context.Background(), breaker.KeyOf(breaker.RouteID(gw, route)), e.clk.Now().UnixNano(), 0); err != nil {
		e.t.Fatal(err)
	}
}
