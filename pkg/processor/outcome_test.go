package processor

import (
	"net/http"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"
)

// Status-level outcomes (R-O1, R-O2, R-O3, R-O5, R-O7, R-O12, R-O15): each
// response is sent twice to a route with failure_threshold 2.
func TestStatusOutcomes(t *testing.T) {
	const upstream = 0
	cases := []struct {
		name    string
		model   string
		route   string
		status  string
		attrs   map[string]*structpb.Struct
		headers []string
		body    string // for the sniffing cases
		opens   bool
		reason  string // outcome reason label
		class   string
		n       float64 // outcomes recorded on the route (default 2)
	}{
		{"5xx listed", "gpt", "openai:us:gpt", "503", attrs(upstream, "via_upstream"), nil, "", true, "provider_5xx", "failure", 0},
		{"502 listed", "gpt", "openai:us:gpt", "502", attrs(upstream, "via_upstream"), nil, "", true, "provider_5xx", "failure", 0},
		{"501 not listed", "gpt", "openai:us:gpt", "501", attrs(upstream, "via_upstream"), nil, "", false, "status_not_listed", "neither", 0},
		{"429 not listed", "gpt", "openai:us:gpt", "429", attrs(upstream, "via_upstream"), nil, "", false, "client_error", "neither", 0},
		{"400 is the request's fault", "gpt", "openai:us:gpt", "400", attrs(upstream, "via_upstream"), nil, "", false, "client_error", "neither", 0},
		{"connect failure UF, list empty", "strict", "openai:us:st", "503", attrs(judge.FlagUF, "upstream_reset_before_response_started{connection_failure}"), nil, "", true, "connection_error", "failure", 0},
		{"reset UR by flags alone", "strict", "openai:us:st", "503", attrs(judge.FlagUR, ""), nil, "", true, "connection_error", "failure", 0},
		{"no healthy upstream UH", "strict", "openai:us:st", "503", attrs(judge.FlagUH, "no_healthy_upstream"), nil, "", true, "connection_error", "failure", 0},
		{"URX with UF", "strict", "openai:us:st", "503", attrs(judge.FlagUF|judge.FlagURX, ""), nil, "", true, "connection_error", "failure", 0},
		{"code details alone", "strict", "openai:us:st", "503", attrs(-1, "upstream_reset_before_response_started{remote_reset}"), nil, "", true, "connection_error", "failure", 0},
		{"timeout UT", "strict", "openai:us:st", "504", attrs(judge.FlagUT, "upstream_response_timeout"), nil, "", true, "timeout", "failure", 0},
		{"open_on_status 401", "strict", "openai:us:st", "401", attrs(upstream, "via_upstream"), nil, "", true, "open_status", "failure", 1},
		{"strict list: provider 503 is neither", "strict", "openai:us:st", "503", attrs(upstream, "via_upstream"), nil, "", false, "status_not_listed", "neither", 0},
		{"cluster not found NC", "gpt", "openai:us:gpt", "503", attrs(judge.FlagNC, "cluster_not_found"), nil, "", false, "cluster_not_found", "neither", 0},
		{"overflow UO", "gpt", "openai:us:gpt", "503", attrs(judge.FlagUO, "upstream_reset_before_response_started{overflow}"), nil, "", false, "envoy_overflow", "neither", 0},
		{"UF with UO: the retry overflowed (R-O15)", "strict", "openai:us:st", "503", attrs(judge.FlagUF|judge.FlagUO, "upstream_reset_before_response_started{remote_connection_failure}"), nil, "", true, "connection_error", "failure", 0},
		{"stream idle timeout SI", "strict", "openai:us:st", "504", attrs(judge.FlagSI, "stream_idle_timeout"), nil, "", true, "timeout", "failure", 0},
		{"overloaded header", "gpt", "openai:us:gpt", "503", nil, []string{"x-envoy-overloaded", "true"}, "", false, "envoy_overflow", "neither", 0},
		{"no attributes: connect text", "strict", "openai:us:st", "503", nil, []string{"content-type", "text/plain"}, "upstream connect error or disconnect/reset before headers. reset reason: connection failure", true, "connection_error", "failure", 0},
		{"no attributes: timeout text", "strict", "openai:us:st", "504", nil, []string{"content-type", "text/plain"}, "upstream request timeout", true, "timeout", "failure", 0},
		{"no attributes: provider text", "strict", "openai:us:st", "503", nil, []string{"content-type", "text/plain"}, "Service Unavailable", false, "status_not_listed", "neither", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			for i := 0; i < 2; i++ {
				c := e.open("")
				c.chat(tc.model)
				r := c.respHeaders(tc.status, false, tc.attrs, tc.headers...)
				if tc.body == "" {
					// The headers decided: body streaming stops.
					if mo := r.ModeOverride; mo == nil || mo.ResponseBodyMode != filterv3.ProcessingMode_NONE {
						t.Fatalf("want a mode_override that stops the body, got %v", r.ModeOverride)
					}
				} else {
					if r.ModeOverride != nil {
						t.Fatal("the body is needed for the heuristics")
					}
					c.respBody(tc.body, true)
				}
				c.end()
			}
			if got := e.status("default", tc.route).State == "open"; got != tc.opens {
				t.Fatalf("opened=%v want %v (%+v)", got, tc.opens, e.status("default", tc.route))
			}
			if tc.n == 0 {
				tc.n = 2
			}
			if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", tc.route, tc.class, tc.reason, breaker.OriginLabel(tc.class, tc.reason))); v != tc.n {
				t.Fatalf("outcomes{%s,%s} = %v", tc.class, tc.reason, v)
			}
		})
	}
}

func TestClusterNotFoundCounted(t *testing.T) {
	e := newEnv(t)
	e.roundTrip("gpt", "503", attrs(judge.FlagNC, "cluster_not_found"))
	if v := testutil.ToFloat64(e.metrics.ClusterNotFound.WithLabelValues("default", "c_openai_us")); v != 1 {
		t.Fatalf("cluster_not_found_total %v", v)
	}
}

// R-A1 through the processor: every Retry-After form blocks the route.
func TestRetryAfterForms(t *testing.T) {
	cases := []struct {
		name string
		hdr  []string
		want time.Duration
	}{
		{"seconds", []string{"retry-after", "20"}, 20 * time.Second},
		{"http date", []string{"retry-after", testT0.Add(45 * time.Second).Format(http.TimeFormat)}, 45 * time.Second},
		{"retry-after-ms", []string{"retry-after-ms", "1500"}, 1500 * time.Millisecond},
		{"x-ms-retry-after-ms", []string{"x-ms-retry-after-ms", "3000"}, 3 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := e.open("")
			c.chat("gpt")
			c.respHeaders("429", false, attrs(0, "via_upstream"), tc.hdr...)
			c.end()
			s := e.status("default", "openai:us:gpt")
			if s.BlockedUntil == nil || time.Duration((*s.BlockedUntil-float64(testT0.UnixNano())/1e9)*1e9).Round(time.Millisecond) != tc.want {
				t.Fatalf("blocked_until %v", s.BlockedUntil)
			}
			c = e.open("")
			if got, _ := headerSet(t, common(c.chat("gpt")), "x-fusebox-cluster"); got != "c_azure_eu" {
				t.Fatalf("blocked route still chosen: %q", got)
			}
			c.end()
		})
	}
}

// R-O8: a stream that ends before the response's end_of_stream is a neither
// and frees the half-open probe slot.
func TestCancelFreesProbeSlot(t *testing.T) {
	e := newEnv(t)
	e.openRoute("default", "openai:us:gpt")
	e.clk.Advance(10 * time.Second) // cooldown over: half-open, 1 probe
	c := e.open("")
	if got, _ := headerSet(t, common(c.chat("gpt")), "x-fusebox-cluster"); got != "c_openai_us" {
		t.Fatalf("probe not admitted: %q", got)
	}
	if s := e.status("default", "openai:us:gpt"); s.State != "half_open" || s.ProbesInFlight != 1 {
		t.Fatalf("%+v", s)
	}
	// A second request finds the slot taken.
	c2 := e.open("")
	if got, _ := headerSet(t, common(c2.chat("gpt")), "x-fusebox-cluster"); got != "c_azure_eu" {
		t.Fatalf("second request took the probe: %q", got)
	}
	c2.end()
	// The client goes away mid-stream: half-close then cancel, as Envoy does.
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
	c.respBody("data: {\"choices\":[]}\n\n", false)
	c.end()
	waitFor(t, func() bool { return e.status("default", "openai:us:gpt").ProbesInFlight == 0 })
	// The slot is free at the stream's end; the neither's label waits
	// access_log.wait_ms for Envoy's entry (labelwait.go).
	e.clk.Advance(3 * time.Second)
	waitFor(t, func() bool { return e.srv.labels.waiting() == 0 })
	if s := e.status("default", "openai:us:gpt"); s.State != "half_open" {
		t.Fatalf("a cancel changed the state: %+v", s)
	}
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "client_cancel", breaker.OriginLabel("neither", "client_cancel"))); v != 1 {
		t.Fatalf("client_cancel outcomes %v", v)
	}
	// A successful probe closes it.
	e.roundTrip("gpt", "200", attrs(0, "via_upstream"))
	waitFor(t, func() bool { return e.status("default", "openai:us:gpt").State == "closed" })
}

// waitFor polls a condition that the server reaches asynchronously after the
// stream ends (no timing assumption beyond a generous bound).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// Pipelined and empty response chunks get exactly one in-order reply each;
// trailers end the response.
func TestBodyChunksPipelinedAndTrailers(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.chat("gpt")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
	chunks := []string{"data: {\"choices\":[{\"delta\":{\"content\":\"H", "", "i\"},\"finish_reason\":\"stop\"}]}\n", "\n", "", "data: [DONE]\n\n"}
	for _, ch := range chunks {
		c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(ch)}}})
	}
	for range chunks {
		if r := c.recv(); r.GetResponseBody() == nil {
			t.Fatalf("want a response_body reply, got %v", r)
		}
	}
	// Trailers without end_of_stream on the body (trailer mode SEND).
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	if r := c.recv(); r.GetResponseTrailers() == nil {
		t.Fatalf("want a response_trailers reply, got %v", r)
	}
	c.end()
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "success", "success", breaker.OriginLabel("success", "success"))); v != 1 {
		t.Fatalf("success %v", v)
	}
}

// The response can start before the request body was answered (an upstream
// or Envoy answering early); every message still gets its own reply.
func TestResponseBeforeRequestBody(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.reqHeaders(false, "content-type", "application/json")
	if r := c.respHeaders("413", false, attrs(0, "request_payload_too_large"), "content-type", "text/plain"); r.GetResponseHeaders() == nil {
		t.Fatalf("%v", r)
	}
	if r := c.reqBody(`{"model":"gpt"}`); r.GetRequestBody() == nil || common(r) != nil {
		t.Fatalf("a late body must get a plain reply, got %v", r)
	}
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	if r := c.recv(); r.GetRequestTrailers() == nil {
		t.Fatalf("%v", r)
	}
	c.respBody("too large", true)
	c.end()
}

// Duplicate messages get a reply of their kind and change nothing.
func TestSpuriousMessages(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.chat("gpt")
	r := c.reqHeaders(false, "content-type", "application/json", "x-fusebox-model", "cheap")
	if r.GetRequestHeaders() == nil || common(r) != nil {
		t.Fatalf("duplicate headers must be a plain reply, got %v", r)
	}
	if r := c.respHeaders("200", false, attrs(0, "via_upstream")); r.GetResponseHeaders() == nil {
		t.Fatal()
	}
	if r := c.respHeaders("500", false, attrs(0, "via_upstream")); r.GetResponseHeaders() == nil || common(r) != nil {
		t.Fatalf("duplicate response headers: %v", r)
	}
	c.respBody("{}", true)
	c.end()
	if s := e.status("default", "openai:us:gpt"); s.WindowFailures != 0 {
		t.Fatalf("duplicate response headers were judged: %+v", s)
	}
}

// Header values in value (not raw_value) are read too; replies use
// raw_value only (checked by headerSet).
func TestValueInsteadOfRawValue(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", Value: "/v1/chat/completions"}, {Key: "x-fusebox-model", Value: "gpt"}}},
	}}})
	if got, _ := headerSet(t, common(c.recv()), "x-fusebox-cluster"); got != "c_openai_us" {
		t.Fatalf("value-only model header ignored: %q", got)
	}
	c.end()
}

// The attempt role gets CONTINUE to a request without a chain, asks Envoy
// for none of its further phases (it streamed every chunk of such
// passthrough traffic before), and records nothing.
func TestAttemptRole(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 3; i++ {
		c := e.open("attempt")
		r := c.reqHeaders(false, "content-type", "application/json", "x-fusebox-model", "gpt")
		mo := r.GetModeOverride()
		if r.GetRequestHeaders() == nil || common(r) != nil || mo == nil || mo.RequestBodyMode != filterv3.ProcessingMode_NONE ||
			mo.ResponseHeaderMode != filterv3.ProcessingMode_SKIP || mo.ResponseBodyMode != filterv3.ProcessingMode_NONE {
			t.Fatalf("attempt role must CONTINUE and skip the rest: %v", r)
		}
		c.respHeaders("500", true, attrs(0, "via_upstream"))
		c.end()
	}
	if s := e.status("default", "openai:us:gpt"); s.WindowCalls != 0 {
		t.Fatalf("attempt role recorded: %+v", s)
	}
}

// R-D7: a panic inside fusebox never fails the request.
func TestPanicIsRecovered(t *testing.T) {
	e := newEnv(t)
	e.srv.testHook = func(req *extprocv3.ProcessingRequest) {
		if req.GetRequestBody() != nil || req.GetResponseHeaders() != nil {
			panic("boom")
		}
	}
	c := e.open("")
	r := c.chat("gpt", "x-fusebox-residency", "eu")
	cr := common(r)
	if r.GetRequestBody() == nil || cr == nil || !cr.ClearRouteCache {
		t.Fatalf("want a dispatch reply after the panic, got %v", r)
	}
	if got, _ := headerSet(t, cr, "x-fusebox-cluster"); got != "c_azure_eu" {
		t.Fatalf("cluster %q", got)
	}
	if r := c.respHeaders("200", false, nil); r.GetResponseHeaders() == nil {
		t.Fatalf("response phase after panic: %v", r)
	}
	c.end()
	if v := testutil.ToFloat64(e.metrics.InternalErrors.WithLabelValues("panic")); v != 2 {
		t.Fatalf("panics counted %v", v)
	}
	// With the model header, the first candidate is known when the panic
	// happens later; before a candidate is known, the reply passes through.
	e.srv.testHook = func(req *extprocv3.ProcessingRequest) {
		if req.GetRequestHeaders() != nil {
			panic("boom")
		}
	}
	c = e.open("")
	r = c.reqHeaders(false, "x-fusebox-model", "gpt")
	if r.GetRequestHeaders() == nil {
		t.Fatalf("%v", r)
	}
	c.end()
}

// A fleet judges with its own policy: 429 fails the fleet, not the route.
func TestFleetOutcomes(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 2; i++ {
		e.roundTrip("llama", "429", attrs(0, "via_upstream"))
	}
	if s := e.status("default", "self:a:llama"); s.State != "closed" {
		t.Fatalf("route opened on a 429 it does not list: %+v", s)
	}
	c := e.open("")
	r := c.chat("llama")
	// The whole fleet is open: both routes unhealthy → try_all.
	if a, _ := stageOf(r); a != "try_all" {
		t.Fatalf("stage %q", a)
	}
	c.end()
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "fleet:gpu", "failure", "provider_429", breaker.OriginLabel("failure", "provider_429"))); v != 2 {
		t.Fatalf("fleet outcomes %v", v)
	}
}

// A 2xx without end_of_stream before the stream closes is not a success.
func TestTruncatedSuccessIsNeither(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.chat("gpt")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":`, false)
	c.end()
	e.clk.Advance(3 * time.Second) // the label's wait for Envoy's entry
	waitFor(t, func() bool {
		return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "client_cancel", breaker.OriginLabel("neither", "client_cancel"))) == 1
	})
	if s := e.status("default", "openai:us:gpt"); s.WindowCalls != 0 {
		t.Fatalf("%+v", s)
	}
}

// With the response body not sent to fusebox (response_body_mode NONE), the
// outcome is judged at the response headers.
func TestResponseBodyModeNone(t *testing.T) {
	e := newEnv(t)
	run := func(status string, a map[string]*structpb.Struct, kv ...string) {
		c := e.open("")
		c.first = false // send protocol_config ourselves
		c.send(&extprocv3.ProcessingRequest{
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_NONE},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json", "x-fusebox-model", "strict")}},
		})
		c.recv()
		if r := c.respHeaders(status, false, a, kv...); r.ModeOverride != nil {
			t.Fatalf("no body is coming; no override needed: %v", r.ModeOverride)
		}
		c.end()
	}
	run("200", attrs(0, "via_upstream"), "content-type", "text/event-stream")
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:st", "success", "success", breaker.OriginLabel("success", "success"))); v != 1 {
		t.Fatalf("2xx at headers: %v", v)
	}
	run("503", nil, "content-type", "text/plain")
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:st", "neither", "status_not_listed", breaker.OriginLabel("neither", "status_not_listed"))); v != 1 {
		t.Fatalf("503 without attributes: %v", v)
	}
}
