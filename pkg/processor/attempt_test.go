package processor

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

const foBody = `{"model":"fo3","messages":[{"role":"user","content":"hi"}]}`

// routeRole runs the route role's request phase for fo3 and returns the
// chain token; its stream ends without response phases, as the shipped
// failover config has it.
func (e *env) routeRole() string {
	e.t.Helper()
	c := e.open("route")
	r := c.chat("fo3")
	c.end()
	tok, ok := headerSet(e.t, common(r), AttemptHeader)
	if !ok {
		e.t.Fatalf("the decision sets no %s: %v", AttemptHeader, r)
	}
	return tok
}

// attempt runs the attempt role's request phase for attempt n of request
// id with the header map as the previous attempt left it (path).
func (e *env) attempt(tok, id string, n int, path string) (c *call, hdrReply, bodyReply string) {
	e.t.Helper()
	c = e.open("attempt")
	r := c.send2(tok, id, n, path)
	if p, ok := headerSet(e.t, common(r), ":path"); ok {
		hdrReply = p
	}
	b := c.reqBody(foBody)
	if cr := common(b); cr != nil && cr.BodyMutation != nil {
		bodyReply = string(cr.BodyMutation.GetBody())
		if cl, _ := headerSet(e.t, cr, "content-length"); cl != itoa(len(bodyReply)) {
			e.t.Fatalf("content-length %s for a body of %d", cl, len(bodyReply))
		}
	}
	return c, hdrReply, bodyReply
}

func (c *call) send2(tok, id string, n int, path string) *extprocv3.ProcessingResponse {
	c.e.t.Helper()
	return c.reqHeaders(false, ":path", path, "content-type", "application/json", AttemptHeader, tok,
		"x-envoy-attempt-count", itoa(n), "x-request-id", id)
}

func (e *env) outcomes(route, class, reason string) float64 {
	return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", route, class, reason, breaker.OriginLabel(class, reason)))
}

// R-X2/R-X3: each attempt applies its route's rewrites (the header map is
// shared, the body is route 1's) and records exactly one outcome against
// the route that served it; the route role records nothing.
func TestAttemptRoleRewritesAndRecordsPerAttempt(t *testing.T) {
	e := newFailoverEnv(t)
	tok := e.routeRole()
	if n := e.outcomes("openai:us:gpt", "neither", "client_cancel"); n != 0 {
		t.Fatalf("the route role recorded %v outcomes", n)
	}
	const azurePath = "/openai/deployments/gpt/chat/completions?api-version=2024-10-21"

	// Attempt 1: openai:us, as the client sent it; the provider says 503.
	c, path, body := e.attempt(tok, "r-7", 1, "/v1/chat/completions")
	if path != "" || body != "" {
		t.Fatalf("attempt 1 rewrote path %q body %q", path, body)
	}
	c.respHeaders("503", true, attrs(0, "via_upstream"))
	c.end()
	// Attempt 2: azure, with its path and deployment name.
	c, path, body = e.attempt(tok, "r-7", 2, "/v1/chat/completions")
	if path != azurePath || !strings.Contains(body, `"model":"gpt-deploy"`) {
		t.Fatalf("attempt 2: path %q body %q", path, body)
	}
	r := c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	if v, _ := headerSet(t, common(r), "x-fusebox-route"); v != "azure:eu:gpt" {
		t.Fatalf("the response names route %q", v)
	}
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()
	// Attempt 3 (a later retry) goes to openai:eu: :path goes back to the
	// client's (attempt 2 left azure's on the shared map), the body keeps
	// the client's model.
	c, path, body = e.attempt(tok, "r-8", 3, azurePath)
	if path != "/v1/chat/completions" || body != "" {
		t.Fatalf("attempt 3: path %q body %q", path, body)
	}
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()

	for _, tc := range []struct {
		route, class, reason string
		want                 float64
	}{
		{"openai:us:gpt", "failure", "provider_5xx", 1},
		{"azure:eu:gpt", "success", "success", 1},
		{"openai:eu:gpt", "success", "success", 1},
		{"openai:us:gpt", "success", "success", 0},
	} {
		// An attempt's outcome may be recorded once the note heard of its
		// arrival, off the reply path: wait for the ones that must come.
		if tc.want > 0 {
			e.waitOutcomes(tc.route, tc.class, tc.reason, tc.want)
		}
		if got := e.outcomes(tc.route, tc.class, tc.reason); got != tc.want {
			t.Errorf("%s %s/%s: %v, want %v", tc.route, tc.class, tc.reason, got, tc.want)
		}
	}
	if s := e.status("default", "openai:us:gpt"); s.WindowFailures != 1 {
		t.Errorf("openai:us:gpt window failures %d, want 1", s.WindowFailures)
	}
}

// An attempt whose stream ends before any response headers is parked: when
// Envoy retries the request (the next attempt arrives) it was a connection
// failure; when nothing follows, a neither that frees its slot.
func TestAttemptEndedBeforeHeaders(t *testing.T) {
	e := newFailoverEnv(t)
	tok := e.routeRole()
	c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end()
	if e.srv.meet.len() != 1 || e.outcomes("openai:us:gpt", "failure", "connection_error") != 0 {
		t.Fatal("the attempt was not parked")
	}
	c, _, _ = e.attempt(tok, "r-1", 2, "/v1/chat/completions")
	e.waitOutcomes("openai:us:gpt", "failure", "connection_error", 1)
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()

	// Nothing follows: a neither once the park ends (on the injected clock).
	tok = e.routeRole()
	c, _, _ = e.attempt(tok, "r-2", 1, "/v1/chat/completions")
	c.end()
	eventually(t, "parked", func() bool { return e.srv.meet.len() == 1 })
	e.clk.Advance(lifecycle.ParkFor)
	e.waitOutcomes("openai:us:gpt", "neither", "no_outcome", 1)
	if e.srv.meet.len() != 0 {
		t.Fatal("still parked")
	}

	// Envoy starts attempt 2 while attempt 1's stream is still being
	// reset: the later attempt may reach fusebox first.
	tok = e.routeRole()
	c2, _, _ := e.attempt(tok, "r-5", 2, "/v1/chat/completions")
	e.waitNote(tok)
	c, _, _ = e.attempt(tok, "r-5", 1, "/v1/chat/completions")
	c.end()
	e.waitOutcomes("openai:us:gpt", "failure", "connection_error", 2)
	c2.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c2.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c2.end()
}

// A half-open probe admitted by the route role is settled by attempt 1's
// outcome: the slot is freed and the breaker closes.
func TestAttemptSettlesTheProbe(t *testing.T) {
	e := newFailoverEnv(t)
	e.openRoute("default", "openai:us:gpt")
	e.clk.Advance(10 * time.Second)
	tok := e.routeRole()
	if s := e.status("default", "openai:us:gpt"); s.State != "half_open" || s.ProbesInFlight != 1 {
		t.Fatalf("after the route role: %s with %d probes", s.State, s.ProbesInFlight)
	}
	c, _, _ := e.attempt(tok, "r-3", 1, "/v1/chat/completions")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()
	// The outcome is recorded on the stream's goroutine after the reply the
	// client read: with both cores busy the status read can come first.
	eventually(t, "the probe's attempt closes the breaker", func() bool {
		s := e.status("default", "openai:us:gpt")
		return s.State == "closed" && s.ProbesInFlight == 0
	})
}

// An attempt-role stream without a token, or with a forged one, changes
// nothing and never answers with an immediate response.
func TestAttemptWithoutToken(t *testing.T) {
	e := newFailoverEnv(t)
	for _, tok := range []string{"", "bm90IGEgdG9rZW4", strings.Repeat("A", 9000)} {
		c := e.open("attempt")
		r := c.reqHeaders(false, AttemptHeader, tok, "x-envoy-attempt-count", "1")
		if r.GetImmediateResponse() != nil || common(r).GetHeaderMutation() != nil {
			t.Fatalf("token %.20q: %v", tok, r)
		}
		c.respHeaders("503", true, attrs(0, "via_upstream"))
		c.end()
	}
	if got := e.outcomes("openai:us:gpt", "failure", "provider_5xx"); got != 0 {
		t.Fatalf("recorded %v without a chain", got)
	}
}

// The token parser reads outside input (a request header): it never
// panics, a token not sealed with the fleet's key is refused, and what it
// accepts round-trips.
func FuzzAttemptToken(f *testing.F) {
	seal := lifecycle.NewSealer([]byte("fuzz key"))
	f.Add(seal.Seal((&attemptToken{V: 1, Gateway: "default", Model: "m", Path: "/v1", Chain: []attemptGroup{{Route: "a:b:c", RouteGen: 3, RouteLease: 1}}}).Payload()))
	f.Add("")
	f.Add("e30")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = seal.Open(s) // never panics on any header value
		// The plaintext parser, on the same bytes as if they were opened.
		tok, err := lifecycle.ParseAttemptPayload([]byte(s))
		if err != nil {
			return
		}
		b, err := seal.Open(seal.Seal(tok.Payload()))
		if err != nil {
			t.Fatal(err)
		}
		again, err := lifecycle.ParseAttemptPayload(b)
		if err != nil || again.Gateway != tok.Gateway || len(again.Chain) != len(tok.Chain) {
			t.Fatalf("%q does not round-trip: %v", s, err)
		}
		if g := tok.Group(1 << 30); g != len(tok.Chain)-1 {
			t.Fatalf("group of a late attempt: %d", g)
		}
	})
}

// R-X10: what reaches a provider in x-fusebox-attempt names no gateway,
// tenant, client path, model or other route; another key cannot open it.
// Before, the header was base64 of JSON holding all of them.
//
// A secret counts as carried when every one of three tokens holds it: a
// token is sealed under a fresh nonce, so what it carries shows in each,
// while a short name ("fo3") turns up in one token's random base64 now
// and then (a loaded CI run's poison step met it: about 1 in 800
// tokens of this length).
func TestAttemptTokenTellsProvidersNothing(t *testing.T) {
	e := newFailoverEnv(t)
	toks := []string{e.routeRole(), e.routeRole(), e.routeRole()}
	for _, secret := range []string{"default", "fo3", "/v1/chat/completions", "openai:us:gpt", "azure:eu:gpt", "c_azure_eu"} {
		in := 0
		for _, tok := range toks {
			raw, _ := base64.RawURLEncoding.DecodeString(tok)
			if strings.Contains(tok, secret) || bytes.Contains(raw, []byte(secret)) {
				in++
			}
		}
		if in == len(toks) {
			t.Fatalf("the token carries %q", secret)
		}
	}
	tok := toks[0]
	if _, err := lifecycle.NewSealer([]byte("another fleet")).Open(tok); err == nil {
		t.Fatal("another key opened the token")
	}
	if _, err := e.srv.parseAttemptToken(tok); err != nil {
		t.Fatalf("its own fleet cannot open it: %v", err)
	}
}

// In the failover deployment the route role is sent no response phases
// (response body NONE): even a model with max_attempts 1 gets a one-group
// chain, since Envoy's priority_group specifier would otherwise send it to
// its configured group, and the attempt role records its outcome.
func TestFailoverDeploymentWithOneAttempt(t *testing.T) {
	e := newFailoverEnv(t)
	c := e.open("route")
	c.respMode = filterv3.ProcessingMode_NONE
	r := c.chat("gpt")
	c.end()
	tok, ok := headerSet(t, common(r), AttemptHeader)
	fo := r.GetDynamicMetadata().GetFields()["fusebox.failover"].GetStructValue()
	groups := fo.GetFields()["priority_groups"].GetListValue().GetValues()
	if !ok || len(groups) != 1 || groups[0].GetStructValue().Fields["name"].GetStringValue() != "openai:us:gpt" {
		t.Fatalf("token %v, groups %v", ok, groups)
	}
	a := e.open("attempt")
	a.reqHeaders(false, AttemptHeader, tok, "x-envoy-attempt-count", "1", "x-request-id", "r-1")
	a.reqBody(`{"model":"gpt","messages":[]}`)
	a.respHeaders("503", true, attrs(0, "via_upstream"))
	a.end()
	// Recorded once the note heard of the attempt's arrival, off the
	// reply path (CI, both cores busy, read 0 here before the wait).
	e.waitOutcomes("openai:us:gpt", "failure", "provider_5xx", 1)
	if got := e.outcomes("openai:us:gpt", "failure", "provider_5xx"); got != 1 {
		t.Fatalf("the attempt role recorded %v", got)
	}
	// The shipped envoy.yaml (envoy.failover false): no chain, no token,
	// unchanged.
	e = newEnv(t)
	c = e.open("route")
	r = c.chat("gpt")
	c.end()
	if _, ok := headerSet(t, common(r), AttemptHeader); ok || r.GetDynamicMetadata().GetFields()["fusebox.failover"] != nil {
		t.Fatal("a chain without failover in the shipped deployment")
	}
}

// R-X8: in the failover deployment the route role never records, whatever
// messages reach it, and its mode override never turns on the response
// phases the deployment keeps off. Before, the override re-enabled
// response headers (and the route role inferred the deployment from its
// body mode): on the model-header path it then credited route 1 with the
// final 200 even when route 1's attempt had failed.
func TestRouteRoleOfFailoverNeverRecords(t *testing.T) {
	e := newFailoverEnv(t)
	c := e.open("route")
	c.respMode = filterv3.ProcessingMode_NONE
	r := c.reqHeaders(false, ":path", "/v1/chat/completions", "content-type", "application/json", "x-fusebox-model", "gpt")
	if mo := r.GetModeOverride(); mo == nil || mo.ResponseHeaderMode != filterv3.ProcessingMode_SKIP || mo.ResponseBodyMode != filterv3.ProcessingMode_NONE {
		t.Fatalf("mode override %v turns on a response phase the deployment keeps off", mo)
	}
	// Envoy sends them anyway (a deployment that allows them): nothing is
	// recorded against route 1.
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()
	for _, class := range []string{"success", "failure", "neither"} {
		for _, reason := range []string{"success", "provider_5xx", "client_cancel"} {
			if n := e.outcomes("openai:us:gpt", class, reason); n != 0 {
				t.Fatalf("the route role recorded %v %s/%s", n, class, reason)
			}
		}
	}
}

// A retried attempt that ran its whole per-try timeout was timed out by
// the router, not refused (#35): the router announces the per-try timeout
// in x-envoy-expected-rq-timeout-ms before each attempt's upstream filters
// run, and an attempt that lasted that long before its stream was reset is
// a timeout. One that ended sooner is a connection error. Before, both were
// connection errors.
func TestPerTryTimeoutIsATimeout(t *testing.T) {
	cases := []struct {
		name   string
		ran    time.Duration
		expect string
		reason string
	}{
		{"ran the per-try timeout", 60 * time.Second, "60000", "timeout"},
		{"refused at once", 200 * time.Millisecond, "60000", "connection_error"},
		{"no per-try timeout announced", 60 * time.Second, "", "connection_error"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Each case on a fresh breaker: two failures would open it.
			e := newFailoverEnv(t)
			before := e.outcomes("openai:us:gpt", "failure", tc.reason)
			tok := e.routeRole()
			id := fmt.Sprint("pt-", i)
			c := e.open("attempt")
			hdr := []string{":path", "/v1/chat/completions", "content-type", "application/json", AttemptHeader, tok,
				"x-envoy-attempt-count", "1", "x-request-id", id}
			if tc.expect != "" {
				hdr = append(hdr, "x-envoy-expected-rq-timeout-ms", tc.expect)
			}
			c.reqHeaders(false, hdr...)
			c.reqBody(foBody)
			e.clk.Advance(tc.ran)
			c.end()
			eventually(t, "parked", func() bool { return e.srv.meet.len() == 1 })
			c2, _, _ := e.attempt(tok, id, 2, "/v1/chat/completions")
			e.waitOutcomes("openai:us:gpt", "failure", tc.reason, before+1)
			c2.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
			c2.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
			c2.end()
		})
	}
}
