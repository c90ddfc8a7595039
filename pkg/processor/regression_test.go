package processor

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// Regressions found by the round-2 review, each held through the real gRPC
// path.

// reload swaps in testConfig edited by edit, as the file reloader does.
func (e *env) reload(edit func(string) string) *routes.Runtime {
	e.t.Helper()
	rt, err := routes.Parse([]byte(edit(testConfig)), routes.Options{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.holder.Store(rt)
	return rt
}

// R-P9: a stream that began before a reload is judged with the policy in
// force when its outcome arrives, and does not put the old policy back.
func TestInFlightStreamUsesReloadedPolicy(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	if got, _ := headerSet(t, common(c.chat("gpt")), "x-fusebox-cluster"); got != "c_openai_us" {
		t.Fatalf("cluster %q", got)
	}
	// Threshold 2 → 1 while the request is in flight.
	e.reload(func(s string) string {
		return strings.Replace(s, "failure_threshold: 2, window_sec: 60", "failure_threshold: 1, window_sec: 60", 1)
	})
	c.respHeaders("500", true, attrs(0, "via_upstream"))
	c.end()
	if s := e.status("default", "openai:us:gpt"); s.State != "open" {
		t.Fatalf("an in-flight 500 after a reload to threshold 1 left %+v", s)
	}
	// The policy in force stays the new one (no old policy put back).
	want := e.holder.Load().Gateways["default"].Routes["openai:us:gpt"].Policy.Version
	if s := e.status("default", "openai:us:gpt"); s.PolicyVersion != want {
		t.Fatalf("policy_version %s, want %s", s.PolicyVersion, want)
	}
}

// R-M4: a route whose own policy is shadow, inside a prod model, is never
// skipped and never takes a probe slot; it is listed under would_skip.
func TestShadowRouteInProdModel(t *testing.T) {
	e := newEnv(t)
	e.roundTrip("mixed", "500", attrs(0, "via_upstream")) // threshold 1: open
	if s := e.status("default", "openai:us:mx"); s.State != "open" {
		t.Fatalf("shadow route must still track health: %+v", s)
	}
	for i := 0; i < 3; i++ {
		c := e.open("")
		r := c.chat("mixed")
		if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_mx1" {
			t.Fatalf("a shadow route was skipped: %q", got)
		}
		if a, rs := stageOf(r); a != "would_skip" || rs != "openai:us:mx" {
			t.Fatalf("stage %q %q", a, rs)
		}
		c.end()
	}
	e.clk.Advance(31 * time.Second) // half-open
	var calls []*call
	for i := 0; i < 5; i++ {
		c := e.open("")
		if got, _ := headerSet(t, common(c.chat("mixed")), "x-fusebox-cluster"); got != "c_mx1" {
			t.Fatalf("half-open shadow route refused request %d: %q", i, got)
		}
		calls = append(calls, c)
	}
	if s := e.status("default", "openai:us:mx"); s.State != "half_open" || s.ProbesInFlight != 0 {
		t.Fatalf("shadow route took probe slots: %+v", s)
	}
	for _, c := range calls {
		c.end()
	}
}

// R-P11: every configured breaker has its state series from the config's
// load; a reload that removes a route removes its series.
func TestStateSeriesFollowConfig(t *testing.T) {
	e := newEnv(t)
	g := e.metrics.State.WithLabelValues("tenant2", "openai:us:gpt", "openai", "gateway")
	if n := testutil.CollectAndCount(e.metrics.State); n == 0 {
		t.Fatal("no state series before the first request")
	}
	if v := testutil.ToFloat64(g); v != 0 {
		t.Fatalf("tenant2 route state %v", v)
	}
	before := testutil.CollectAndCount(e.metrics.State)
	e.reload(func(s string) string {
		return strings.Replace(s, `      - {name: gpt, routes: ["openai:us:gpt", "azure:eu:gpt"]}
    routes:
      - {key: "openai:us:gpt", cluster: t2_openai}`, `      - {name: gpt, routes: ["openai:us:gpt2"]}
    routes:
      - {key: "openai:us:gpt2", cluster: t2_openai}`, 1)
	})
	after := testutil.CollectAndCount(e.metrics.State)
	if after != before {
		t.Fatalf("series %d → %d: one removed and one added should keep the count", before, after)
	}
	if strings.Contains(gatherText(t, e), `route="openai:us:gpt",scope="gateway"} 0`) && !strings.Contains(gatherText(t, e), `gateway="default"`) {
		t.Fatal("unreachable")
	}
	if strings.Contains(gatherText(t, e), `aig_circuit_breaker_state{gateway="tenant2",provider="openai",route="openai:us:gpt",`) {
		t.Fatal("the removed route kept its state series")
	}
	if !strings.Contains(gatherText(t, e), `aig_circuit_breaker_state{gateway="tenant2",provider="openai",route="openai:us:gpt2",`) {
		t.Fatal("the added route has no state series")
	}
}

func gatherText(t *testing.T, e *env) string {
	t.Helper()
	mfs, err := e.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if mf.GetName() != "aig_circuit_breaker_state" {
			continue
		}
		for _, m := range mf.Metric {
			b.WriteString("aig_circuit_breaker_state{")
			for i, l := range m.Label {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(l.GetName() + `="` + l.GetValue() + `"`)
			}
			b.WriteString(",}\n")
		}
	}
	return b.String()
}

// R-P11: a stream still on an old Runtime does not republish state series
// for breakers a reload removed.
func TestOldRuntimeStreamDoesNotRepublish(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.chat("gpt", "x-fusebox-gateway", "tenant2")
	e.reload(func(s string) string {
		return strings.Replace(s, `"openai:us:gpt", cluster: t2_openai}`, `"openai:us:gpt", cluster: t2_openai, circuit_breaker: {failure_threshold: 1}}`, 1)
	})
	e.reload(func(s string) string {
		return strings.Replace(s, `routes: ["openai:us:gpt", "azure:eu:gpt"]}
    routes:
      - {key: "openai:us:gpt", cluster: t2_openai}`, `routes: ["openai:us:gpt2"]}
    routes:
      - {key: "openai:us:gpt2", cluster: t2_openai}`, 1)
	})
	c.respHeaders("500", true, attrs(0, "via_upstream"))
	c.end()
	c2 := e.open("")
	c2.chat("gpt")
	c2.end()
	if strings.Contains(gatherText(t, e), `gateway="tenant2",provider="openai",route="openai:us:gpt",`) {
		t.Fatal("a stream on an old config republished a removed route's state")
	}
}

// R-D7: a panic while recording at the stream's end is recovered and
// counted; the server keeps serving.
func TestPanicAtStreamEndIsRecovered(t *testing.T) {
	e := newEnv(t)
	e.srv.finishHook = func() { panic("boom at finish") }
	c := e.open("")
	c.chat("gpt")
	c.end()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(e.metrics.InternalErrors.WithLabelValues("panic")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the panic at stream end was not counted")
		}
		time.Sleep(time.Millisecond)
	}
	e.srv.finishHook = nil
	if got, _ := headerSet(t, common(e.roundTrip("gpt", "200", nil)), "x-fusebox-cluster"); got == "" {
		t.Fatal("the server stopped serving after a panic at stream end")
	}
}

// R-D4: a request with a non-JSON content type and a null model names no
// model: it passes through.
func TestNullModelNonJSONPassesThrough(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	r := c.reqHeaders(false, "content-type", "application/x-www-form-urlencoded")
	if r.GetRequestHeaders() == nil {
		t.Fatalf("headers reply %v", r)
	}
	// Non-JSON requests are told to skip the body; a body that still
	// arrives (older Envoy, or mode_override not allowed) must pass too.
	for _, ct := range []string{"text/plain", ""} {
		c2 := e.open("")
		if ct != "" {
			c2.reqHeaders(false, "content-type", ct)
		} else {
			c2.reqHeaders(false)
		}
		r = c2.reqBody(`{"model":null}`)
		if r.GetImmediateResponse() != nil || r.GetRequestBody() == nil {
			t.Fatalf("content-type %q: a body with a null model got %v", ct, r)
		}
		c2.end()
	}
	// A declared JSON request must name its model.
	c3 := e.open("")
	c3.reqHeaders(false, "content-type", "application/json")
	if r = c3.reqBody(`{"model":null}`); r.GetImmediateResponse().GetStatus().GetCode() != 400 {
		t.Fatalf("declared JSON with a null model: %v", r)
	}
	c3.end()
	c.end()
}

// A 2xx whose response has trailers, with trailer mode SKIP: Envoy never
// sends end_of_stream for the body (docs/ext_proc.md), yet the body is complete. It
// is judged a success, not a client cancel.
func TestTrailersSkippedCompleteBodyIsSuccess(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	c.chat("gpt")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
	c.respBody("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", false)
	c.respBody("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", false)
	c.end()
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "success", "success", breaker.OriginLabel("success", "success"))); v != 1 {
		t.Fatalf("success outcomes %v", v)
	}
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "client_cancel", breaker.OriginLabel("neither", "client_cancel"))); v != 0 {
		t.Fatalf("client_cancel outcomes %v", v)
	}
	// A stream cut before its end marker is still a client cancel.
	c = e.open("")
	c.chat("gpt")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
	c.respBody("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", false)
	c.end()
	e.clk.Advance(3 * time.Second) // the label's wait for Envoy's entry
	waitFor(t, func() bool { return e.srv.labels.waiting() == 0 })
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "client_cancel", breaker.OriginLabel("neither", "client_cancel"))); v != 1 {
		t.Fatalf("client_cancel outcomes %v", v)
	}
}
