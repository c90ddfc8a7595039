package processor

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func stageOf(r *extprocv3.ProcessingResponse) (action, routes string) {
	md := r.GetDynamicMetadata()
	if md == nil {
		return "", ""
	}
	fb := md.Fields["fusebox"].GetStructValue()
	if fb != nil && fb.Fields["stage"] == nil && fb.Fields["decision"] != nil {
		return "", "" // only the decision id (R-AL2) and the model (R-R1): no stage
	}
	if fb == nil || fb.Fields["stage"].GetStringValue() != "circuit_breaker" {
		return "?", ""
	}
	return fb.Fields["action"].GetStringValue(), fb.Fields["routes"].GetStringValue()
}

func errorCode(t *testing.T, r *extprocv3.ProcessingResponse) (int, string) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an immediate response, got %v", r)
	}
	var body struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(ir.Body, &body); err != nil {
		t.Fatalf("error body is not JSON: %q", ir.Body)
	}
	if body.Error.Message == "" || body.Error.Type == "" {
		t.Fatalf("error body lacks message/type: %s", ir.Body)
	}
	ct := ""
	for _, h := range ir.Headers.GetSetHeaders() {
		if h.Header.Key == "content-type" {
			ct = string(h.Header.RawValue)
		}
	}
	if ct != "application/json" {
		t.Fatalf("content-type %q", ct)
	}
	return int(ir.Status.Code), body.Error.Code
}

// R-D3: cluster, route and fallbacks headers in raw_value, clear_route_cache
// in the same reply, decided at the buffered body.
func TestDispatchHeaders(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	if r := c.reqHeaders(false, "content-type", "application/json"); common(r) != nil || r.ModeOverride != nil {
		t.Fatalf("headers reply must wait for the body: %v", r)
	}
	r := c.reqBody(`{"model":"gpt","messages":[]}`)
	cr := common(r)
	if r.GetRequestBody() == nil || !cr.ClearRouteCache {
		t.Fatalf("want a body reply with clear_route_cache, got %v", r)
	}
	for k, want := range map[string]string{"x-fusebox-cluster": "c_openai_us", "x-fusebox-route": "openai:us:gpt", "x-fusebox-fallbacks": "c_azure_eu,c_openai_eu"} {
		if got, _ := headerSet(t, cr, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if _, ok := headerSet(t, cr, ":path"); ok || cr.BodyMutation != nil {
		t.Fatal("route without path/upstream_model must not rewrite")
	}
	if a, _ := stageOf(r); a != "" {
		t.Fatalf("no stage when nothing was skipped, got %q", a)
	}
	// x-fusebox-route goes back to the client.
	rh := c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	if got, _ := headerSet(t, common(rh), "x-fusebox-route"); got != "openai:us:gpt" {
		t.Fatalf("response x-fusebox-route = %q", got)
	}
	c.respBody(`{}`, true)
	c.end()
	if v := testutil.ToFloat64(e.metrics.Decisions.WithLabelValues("default", "gpt", "routed")); v != 1 {
		t.Fatalf("routed decisions %v", v)
	}
}

// R-D3: upstream_model rewrite with content-length, and the :path rewrite.
func TestRewrites(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	r := c.chat("gpt", "x-fusebox-residency", "eu")
	cr := common(r)
	if got, _ := headerSet(t, cr, "x-fusebox-cluster"); got != "c_azure_eu" {
		t.Fatalf("cluster %q", got)
	}
	if got, _ := headerSet(t, cr, ":path"); got != "/openai/deployments/gpt/chat/completions?api-version=2024-10-21" {
		t.Fatalf(":path %q", got)
	}
	body := cr.GetBodyMutation().GetBody()
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil || v["model"] != "gpt-deploy" {
		t.Fatalf("body %s", body)
	}
	if got, _ := headerSet(t, cr, "content-length"); got != itoa(len(body)) {
		t.Fatalf("content-length %q for %d bytes", got, len(body))
	}
	c.end()
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// R-D5: the model header decides at request headers, with a mode_override
// that skips the body and repeats the response modes; with upstream_model
// the body is still read and rewritten.
func TestModelHeaderFastPath(t *testing.T) {
	e := newEnv(t)
	c := e.open("")
	r := c.reqHeaders(false, "content-type", "application/json", "x-fusebox-model", "gpt")
	cr := common(r)
	if r.GetRequestHeaders() == nil || !cr.ClearRouteCache {
		t.Fatalf("want the decision in the headers reply: %v", r)
	}
	if got, _ := headerSet(t, cr, "x-fusebox-cluster"); got != "c_openai_us" {
		t.Fatalf("cluster %q", got)
	}
	mo := r.ModeOverride
	if mo == nil || mo.RequestBodyMode != filterv3.ProcessingMode_NONE || mo.ResponseBodyMode != filterv3.ProcessingMode_STREAMED ||
		mo.ResponseHeaderMode != filterv3.ProcessingMode_SEND {
		t.Fatalf("mode_override %v", mo)
	}
	c.end()

	// The header wins over the body; upstream_model keeps the body coming.
	c = e.open("")
	r = c.reqHeaders(false, "content-type", "application/json", "x-fusebox-model", "gpt", "x-fusebox-residency", "eu")
	if r.ModeOverride != nil {
		t.Fatal("a route with upstream_model needs the body")
	}
	if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_azure_eu" {
		t.Fatalf("cluster %q", got)
	}
	br := c.reqBody(`{"model":"something-else","messages":[]}`)
	if cr := common(br); cr.GetBodyMutation() == nil || !strings.Contains(string(cr.GetBodyMutation().GetBody()), `"gpt-deploy"`) {
		t.Fatalf("body not rewritten: %v", br)
	} else if cr.ClearRouteCache {
		t.Fatal("the route was chosen at headers; the body reply only rewrites")
	}
	c.end()
}

// R-D4: gateway defaulting, unknown gateway/model, bad JSON, pass-through.
func TestRequestErrorsAndPassThrough(t *testing.T) {
	e := newEnv(t)
	t.Run("unknown gateway", func(t *testing.T) {
		c := e.open("")
		r := c.reqHeaders(false, "x-fusebox-gateway", "nope", "content-type", "application/json")
		if code, ec := errorCode(t, r); code != 404 || ec != "gateway_not_found" {
			t.Fatalf("%d %s", code, ec)
		}
	})
	t.Run("empty gateway is default", func(t *testing.T) {
		c := e.open("")
		r := c.chat("gpt", "x-fusebox-gateway", "")
		if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_openai_us" {
			t.Fatalf("%v", r)
		}
		c.end()
	})
	t.Run("other gateway", func(t *testing.T) {
		c := e.open("")
		r := c.chat("gpt", "x-fusebox-gateway", "tenant2")
		if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "t2_openai" {
			t.Fatalf("%v", r)
		}
		c.end()
	})
	t.Run("unknown model", func(t *testing.T) {
		c := e.open("")
		if code, ec := errorCode(t, c.chat("gpt-9")); code != 404 || ec != "model_not_found" {
			t.Fatalf("%d %s", code, ec)
		}
		if v := testutil.ToFloat64(e.metrics.Decisions.WithLabelValues("default", "", "rejected")); v < 1 {
			t.Fatal("rejected not counted with model \"\"")
		}
	})
	t.Run("residency leaves nothing", func(t *testing.T) {
		c := e.open("")
		r := c.chat("gpt", "x-fusebox-residency", "cn")
		code, ec := errorCode(t, r)
		if code != 404 || ec != "model_not_found" || !strings.Contains(string(r.GetImmediateResponse().Body), "cn") {
			t.Fatalf("%d %s %s", code, ec, r.GetImmediateResponse().Body)
		}
	})
	for name, body := range map[string]string{"broken JSON": `{"model":"gpt",`, "model not a string": `{"model":5}`, "array": `[1]`} {
		t.Run(name, func(t *testing.T) {
			c := e.open("")
			c.reqHeaders(false, "content-type", "application/json; charset=utf-8")
			if code, ec := errorCode(t, c.reqBody(body)); code != 400 || ec != "invalid_request" {
				t.Fatalf("%d %s", code, ec)
			}
		})
	}
	t.Run("no body: GET /v1/models", func(t *testing.T) {
		c := e.open("")
		r := c.reqHeaders(true)
		if r.GetRequestHeaders() == nil || common(r) != nil {
			t.Fatalf("want plain CONTINUE, got %v", r)
		}
		c.respHeaders("200", true, nil)
		c.end()
	})
	t.Run("multipart audio", func(t *testing.T) {
		c := e.open("")
		r := c.reqHeaders(false, "content-type", "multipart/form-data; boundary=x")
		if r.ModeOverride == nil || r.ModeOverride.RequestBodyMode != filterv3.ProcessingMode_NONE || r.ModeOverride.ResponseBodyMode != filterv3.ProcessingMode_STREAMED {
			t.Fatalf("want the body skipped, got %v", r)
		}
		c.end()
	})
	t.Run("JSON without model", func(t *testing.T) {
		c := e.open("")
		c.reqHeaders(false, "content-type", "application/json")
		r := c.reqBody(`{"input":"x"}`)
		if r.GetRequestBody() == nil || common(r) != nil {
			t.Fatalf("want pass-through, got %v", r)
		}
		c.end()
	})
	t.Run("client cluster header is removed on pass-through", func(t *testing.T) {
		c := e.open("")
		r := c.reqHeaders(true, "x-fusebox-cluster", "c_evil")
		cr := common(r)
		if cr == nil || !cr.ClearRouteCache || !strings.Contains(strings.Join(cr.HeaderMutation.RemoveHeaders, ","), "x-fusebox-cluster") {
			t.Fatalf("want the header removed: %v", r)
		}
		c.end()
	})
	if v := testutil.ToFloat64(e.metrics.Decisions.WithLabelValues("default", "", "passthrough")); v != 4 {
		t.Fatalf("passthrough decisions %v", v)
	}
}

// R-D1: cheapest order (cost × bias), residency filter.
func TestOrderingAndResidency(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		model, residency, cluster, fallbacks string
	}{
		{"cheap", "", "c_azure_eu", "c_openai_eu,c_openai_us"},
		{"gpt", "", "c_openai_us", "c_azure_eu,c_openai_eu"},
		{"gpt", "eu", "c_azure_eu", "c_openai_eu"},
		{"gpt", "us", "c_openai_us", ""},
	}
	for _, tc := range cases {
		c := e.open("")
		var kv []string
		if tc.residency != "" {
			kv = []string{"x-fusebox-residency", tc.residency}
		}
		cr := common(c.chat(tc.model, kv...))
		got, _ := headerSet(t, cr, "x-fusebox-cluster")
		fb, _ := headerSet(t, cr, "x-fusebox-fallbacks")
		if got != tc.cluster || fb != tc.fallbacks {
			t.Errorf("%s/%s: cluster %q fallbacks %q", tc.model, tc.residency, got, fb)
		}
		if tc.fallbacks == "" && !strings.Contains(strings.Join(cr.HeaderMutation.RemoveHeaders, ","), "x-fusebox-fallbacks") {
			t.Errorf("empty fallbacks must remove the header")
		}
		c.end()
	}
}

// R-D2, R-M3: an open route is skipped and the stage says so.
func TestSkipOpenRoute(t *testing.T) {
	e := newEnv(t)
	e.openRoute("default", "openai:us:gpt")
	c := e.open("")
	r := c.chat("gpt")
	if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_azure_eu" {
		t.Fatalf("cluster %q", got)
	}
	if a, rs := stageOf(r); a != "skipped" || rs != "openai:us:gpt" {
		t.Fatalf("stage %q %q", a, rs)
	}
	c.end()
	if v := testutil.ToFloat64(e.metrics.Decisions.WithLabelValues("default", "gpt", "skipped")); v != 1 {
		t.Fatalf("skipped %v", v)
	}
	// Another gateway's route with the same key is independent.
	c = e.open("")
	if got, _ := headerSet(t, common(c.chat("gpt", "x-fusebox-gateway", "tenant2")), "x-fusebox-cluster"); got != "t2_openai" {
		t.Fatalf("tenant2 affected: %q", got)
	}
	c.end()
}

// R-M2: shadow dispatches as if off, tracks health, reports would_skip.
func TestShadowMode(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 2; i++ {
		e.roundTrip("shadowed", "500", attrs(0, "via_upstream"))
	}
	if s := e.status("default", "openai:us:sh"); s.State != "open" {
		t.Fatalf("shadow must track health: %+v", s)
	}
	c := e.open("")
	r := c.chat("shadowed")
	if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_sh1" {
		t.Fatalf("shadow changed routing: %q", got)
	}
	if a, rs := stageOf(r); a != "would_skip" || rs != "openai:us:sh" {
		t.Fatalf("stage %q %q", a, rs)
	}
	c.end()
	if v := testutil.ToFloat64(e.metrics.Decisions.WithLabelValues("default", "shadowed", "would_skip")); v != 1 {
		t.Fatalf("would_skip %v", v)
	}
}

// R-M1: off consults and records nothing but still dispatches.
func TestOffMode(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 5; i++ {
		r := e.roundTrip("offm", "500", attrs(0, "via_upstream"))
		if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_off1" {
			t.Fatalf("off must dispatch to the first candidate, got %q", got)
		}
		if a, _ := stageOf(r); a != "" {
			t.Fatal("off emits no stage")
		}
	}
	// The breaker exists from the config's load (R-P11) and recorded
	// nothing.
	if s := e.status("default", "openai:us:off"); s.WindowCalls != 0 || s.State != "closed" || s.Generation != 1 {
		t.Fatalf("off recorded: %+v", s)
	}
	if got := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:off", "failure", "provider_5xx", breaker.OriginLabel("failure", "provider_5xx"))); got != 0 {
		t.Fatalf("off counted %v outcomes", got)
	}
}

// R-F3: fail_fast answers 503 with retry-after and the JSON body; try_all
// keeps every candidate.
func TestWhenAllOpen(t *testing.T) {
	e := newEnv(t)
	e.openRoute("default", "openai:us:ff")
	e.clk.Advance(2500 * time.Millisecond)
	e.openRoute("default", "azure:eu:ff")
	c := e.open("")
	r := c.chat("ff")
	code, ec := errorCode(t, r)
	if code != 503 || ec != "all_routes_open" {
		t.Fatalf("%d %s", code, ec)
	}
	ra := ""
	for _, h := range r.GetImmediateResponse().Headers.SetHeaders {
		if h.Header.Key == "retry-after" {
			ra = string(h.Header.RawValue)
		}
	}
	if ra != "8" { // openai:us:ff opened 2.5 s earlier with a 10 s cooldown: ceil(7.5)
		t.Fatalf("retry-after %q", ra)
	}
	if !strings.Contains(string(r.GetImmediateResponse().Body), `"type":"service_unavailable"`) {
		t.Fatalf("body %s", r.GetImmediateResponse().Body)
	}

	for _, k := range []string{"openai:us:gpt", "azure:eu:gpt", "openai:eu:gpt"} {
		e.openRoute("default", k)
	}
	c = e.open("")
	r = c.chat("gpt")
	if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_openai_us" {
		t.Fatalf("try_all must keep routing order, got %q", got)
	}
	if fb, _ := headerSet(t, common(r), "x-fusebox-fallbacks"); fb != "c_azure_eu,c_openai_eu" {
		t.Fatalf("fallbacks %q", fb)
	}
	if a, _ := stageOf(r); a != "try_all" {
		t.Fatalf("stage %q", a)
	}
	c.end()
}

// R-F2 + R-D6: with the floor binding, the route closest to recovery stays.
func TestFloorKeepsClosestToRecovery(t *testing.T) {
	e := newEnv(t)
	e.openRoute("default", "openai:us:fl")
	e.clk.Advance(3 * time.Second)
	e.openRoute("default", "azure:eu:fl")
	c := e.open("")
	r := c.chat("floor")
	if got, _ := headerSet(t, common(r), "x-fusebox-cluster"); got != "c_fl1" {
		t.Fatalf("want the route closest to recovery, got %q", got)
	}
	if a, rs := stageOf(r); a != "skipped" || rs != "azure:eu:fl" {
		t.Fatalf("stage %q %q", a, rs)
	}
	c.end()
}

// R-S5 through the processor: forced open is removed before try_all.
func TestForcedOpenBeatsTryAll(t *testing.T) {
	e := newEnv(t)
	rt := e.holder.Load()
	for _, k := range []string{"openai:us:gpt", "azure:eu:gpt", "openai:eu:gpt"} {
		e.openRoute("default", k)
	}
	e.forceOpen("default", rt.Gateways["default"].Routes["openai:us:gpt"].Key)
	c := e.open("")
	if got, _ := headerSet(t, common(c.chat("gpt")), "x-fusebox-cluster"); got != "c_azure_eu" {
		t.Fatalf("forced route dispatched: %q", got)
	}
	c.end()
}

// R-S5: a route forced open is removed in shadow mode too.
func TestForcedOpenInShadow(t *testing.T) {
	e := newEnv(t)
	e.forceOpen("default", "openai:us:sh")
	c := e.open("")
	resp := c.chat("shadowed")
	if got, _ := headerSet(t, common(resp), "x-fusebox-cluster"); got != "c_sh2" {
		t.Fatalf("shadow dispatched to a forced-open route: %q", got)
	}
	if fb, _ := headerSet(t, common(resp), "x-fusebox-fallbacks"); fb != "" {
		t.Fatalf("fallbacks %q", fb)
	}
	// Forced open is really skipped, in shadow too (R-S5).
	if a, rs := stageOf(resp); a != "skipped" || rs != "openai:us:sh" {
		t.Fatalf("stage %q %q", a, rs)
	}
	c.end()
}
