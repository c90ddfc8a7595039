package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

const gpt = "gpt-4o-mini"

// An outage opens the breaker after failure_threshold failures and traffic
// moves to the next route; the client saw exactly that many errors.
func TestOutageOpensAndTrafficMoves(t *testing.T) {
	cases := []struct {
		name   string
		fault  func(p *fakeprovider.Provider)
		reason string
	}{
		{"provider 503", func(p *fakeprovider.Provider) { p.SetFault(fakeprovider.Fault{Status: 503}) }, "provider_5xx"},
		{"connection refused", func(p *fakeprovider.Provider) { p.Down() }, "connection_error"},
		{"reset before headers", func(p *fakeprovider.Provider) { p.SetFault(fakeprovider.Fault{ResetBeforeHeaders: true}) }, "connection_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			p := w.proxy("default", nil)
			if r := chat(t, p, gpt, true); r.status != 200 || r.servedBy() != "openai_us" || r.route() != "openai:us-east:gpt-4o-mini" {
				t.Fatalf("healthy: %d %q %q", r.status, r.servedBy(), r.route())
			}
			tc.fault(w.providers["openai_us"])
			failed := 0
			var last reply
			for i := 0; i < 10; i++ {
				r := chat(t, p, gpt, i%2 == 0)
				last = r
				if r.status != 200 {
					failed++
					continue
				}
				if r.servedBy() != "azure_eu" || r.route() != "azure:eu-west:gpt-4o-mini" {
					t.Fatalf("request %d served by %q route %q", i, r.servedBy(), r.route())
				}
			}
			if failed != 3 {
				t.Fatalf("%d client errors before routing around, want failure_threshold=3", failed)
			}
			b := w.breaker("default", "openai:us-east:gpt-4o-mini")
			if b["state"] != "open" || b["reason"] != tc.reason || b["opened_at"].(float64) != float64(t0.Unix()) {
				t.Fatalf("status API: %v", b)
			}
			// The azure route's rewrites reached the provider.
			hdr, model := w.providers["azure_eu"].LastRequest()
			if model != "gpt4o-mini-deploy" {
				t.Fatalf("upstream model %q", model)
			}
			for k := range hdr {
				if strings.HasPrefix(strings.ToLower(k), "x-fusebox-") {
					t.Fatalf("fusebox header %s reached the provider", k)
				}
			}
			if st := last.entry(t, p).FuseboxStage(); st["action"] != "skipped" || st["routes"] != "openai:us-east:gpt-4o-mini" {
				t.Fatalf("access log stage %v", st)
			}
			m := w.scrape()
			for _, want := range []string{
				`aig_circuit_breaker_state{gateway="default",provider="openai",route="openai:us-east:gpt-4o-mini",scope="gateway"} 1`,
				`aig_circuit_breaker_state{gateway="default",provider="azure",route="azure:eu-west:gpt-4o-mini",scope="gateway"} 0`,
				`aig_circuit_breaker_transitions_total{gateway="default",provider="openai",reason="` + tc.reason + `",route="openai:us-east:gpt-4o-mini",scope="gateway",transition="closed->open"} 1`,
				`aig_circuit_breaker_decisions_total{action="skipped",gateway="default",model="gpt-4o-mini"} 7`,
			} {
				if !strings.Contains(m, want) {
					t.Errorf("metrics lack %s", want)
				}
			}
			if !strings.Contains(w.logs.String(), "[circuit_breaker] closed->open") || !strings.Contains(w.logs.String(), "failures=3/3") {
				t.Error("no [circuit_breaker] transition log line")
			}
		})
	}
}

// Recovery: after the cooldown a probe goes to the route; its success
// closes the breaker and traffic returns.
func TestRecoveryThroughHalfOpen(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil)
	up := w.providers["openai_us"]
	up.SetFault(fakeprovider.Fault{Status: 500})
	for i := 0; i < 3; i++ {
		chat(t, p, gpt, false)
	}
	if w.breaker("default", "openai:us-east:gpt-4o-mini")["state"] != "open" {
		t.Fatal("not open")
	}
	up.SetFault(fakeprovider.Fault{})
	w.clk.Advance(29 * time.Second)
	if r := chat(t, p, gpt, true); r.servedBy() != "azure_eu" {
		t.Fatalf("probed before the cooldown: %q", r.servedBy())
	}
	w.clk.Advance(time.Second)
	if b := w.breaker("default", "openai:us-east:gpt-4o-mini"); b["state"] != "half_open" {
		t.Fatalf("after the cooldown: %v", b)
	}
	if r := chat(t, p, gpt, true); r.status != 200 || r.servedBy() != "openai_us" {
		t.Fatalf("probe: %d %q", r.status, r.servedBy())
	}
	if b := w.breaker("default", "openai:us-east:gpt-4o-mini"); b != nil {
		t.Fatalf("a successful probe must close it: %v", b)
	}
	for i := 0; i < 3; i++ {
		if r := chat(t, p, gpt, i == 0); r.servedBy() != "openai_us" {
			t.Fatalf("traffic did not return: %q", r.servedBy())
		}
	}
	// A failed probe re-opens with reopened_at set.
	up.SetFault(fakeprovider.Fault{Status: 502})
	for i := 0; i < 3; i++ {
		chat(t, p, gpt, false)
	}
	w.clk.Advance(30 * time.Second)
	if r := chat(t, p, gpt, false); r.status != 502 {
		t.Fatalf("probe: %d", r.status)
	}
	b := w.breaker("default", "openai:us-east:gpt-4o-mini")
	if b["state"] != "open" || b["reopens"].(float64) != 1 || b["reopened_at"] == nil {
		t.Fatalf("after a failed probe: %v", b)
	}
}

// Shadow mode tracks health and reports would_skip, but routes as if off.
func TestShadowModeChangesNothing(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("shadow", nil)
	w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
	var last reply
	for i := 0; i < 8; i++ {
		if last = chat(t, p, gpt, false); last.status != 503 || last.route() != "openai:us-east:gpt-4o-mini" {
			t.Fatalf("shadow changed routing: %d %q", last.status, last.route())
		}
	}
	if b := w.breaker("shadow", "openai:us-east:gpt-4o-mini"); b["state"] != "open" {
		t.Fatalf("shadow must track health: %v", b)
	}
	if st := last.entry(t, p).FuseboxStage(); st["action"] != "would_skip" || st["routes"] != "openai:us-east:gpt-4o-mini" {
		t.Fatalf("stage %v", st)
	}
}

// fail_fast answers 503 at once; try_all keeps dispatching.
func TestFailFastAndTryAll(t *testing.T) {
	w := newWorld(t)
	ff := w.proxy("failfast", nil)
	w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
	w.providers["openai_eu"].SetFault(fakeprovider.Fault{Status: 503})
	for i := 0; i < 6; i++ {
		chat(t, ff, gpt, false)
	}
	served := w.providers["openai_us"].Served() + w.providers["openai_eu"].Served()
	r := chat(t, ff, gpt, false)
	if r.status != 503 || !strings.Contains(r.body, `"code":"all_routes_open"`) || r.header.Get("retry-after") != "30" {
		t.Fatalf("fail_fast: %d %q retry-after=%q", r.status, r.body, r.header.Get("retry-after"))
	}
	if w.providers["openai_us"].Served()+w.providers["openai_eu"].Served() != served {
		t.Fatal("fail_fast dispatched the request")
	}

	d := w.proxy("default", nil)
	w.providers["anthropic_us"].SetFault(fakeprovider.Fault{Status: 503})
	w.providers["anthropic_eu"].SetFault(fakeprovider.Fault{Status: 503})
	body := `{"model":"claude","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	for i := 0; i < 6; i++ {
		do(t, d, "POST", "/v1/messages", body)
	}
	before := w.providers["anthropic_us"].Served()
	r = do(t, d, "POST", "/v1/messages", body)
	if r.route() != "anthropic:us:claude" || w.providers["anthropic_us"].Served() != before+1 {
		t.Fatalf("try_all must dispatch to the first route: %q", r.route())
	}
	if st := r.entry(t, d).FuseboxStage(); st["action"] != "try_all" {
		t.Fatalf("stage %v", st)
	}
}

// A 429 with Retry-After blocks the route until the deadline.
func TestRetryAfterBlock(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("ratelimited", nil)
	up := w.providers["openai_us"]
	up.SetFault(fakeprovider.Fault{Status: 429, RetryAfter: "20"})
	if r := chat(t, p, gpt, false); r.status != 429 {
		t.Fatalf("%d", r.status)
	}
	up.SetFault(fakeprovider.Fault{})
	b := w.breaker("ratelimited", "openai:us-east:gpt-4o-mini")
	if b["state"] != "closed" || b["blocked_until"].(float64) != float64(t0.Unix()+20) {
		t.Fatalf("%v", b)
	}
	if r := chat(t, p, gpt, true); r.servedBy() != "openai_eu" {
		t.Fatalf("blocked route used: %q", r.servedBy())
	}
	w.clk.Advance(20 * time.Second)
	if r := chat(t, p, gpt, true); r.servedBy() != "openai_us" {
		t.Fatalf("block outlived its deadline: %q", r.servedBy())
	}
}

// Residency comes from the virtual host; nothing relaxes it.
func TestResidency(t *testing.T) {
	w := newWorld(t)
	eu := w.proxy("default", map[string]string{"x-fusebox-residency": "eu"})
	if r := chat(t, eu, gpt, false, "x-fusebox-residency", "us"); r.servedBy() != "azure_eu" {
		t.Fatalf("served by %q", r.servedBy())
	}
	w.providers["azure_eu"].SetFault(fakeprovider.Fault{Status: 500})
	w.providers["openai_eu"].SetFault(fakeprovider.Fault{Status: 500})
	var last reply
	for i := 0; i < 10; i++ {
		last = chat(t, eu, gpt, false)
	}
	if n := w.providers["openai_us"].Served(); n != 0 {
		t.Fatalf("an EU request reached the US route %d times", n)
	}
	if st := last.entry(t, eu).FuseboxStage(); st["action"] != "try_all" {
		t.Fatalf("stage %v", st)
	}
}

// Noise never trips a breaker: the request's own 4xx, client cancels, and
// Envoy's own overflow.
func TestNoisyProviderNeverTrips(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil, func(c *envoysim.Config) { c.Clusters["openai_us"].MaxRequests = 1 })
	up := w.providers["openai_us"]

	up.SetFault(fakeprovider.Fault{Status: 400})
	for i := 0; i < 6; i++ {
		if r := chat(t, p, gpt, false); r.status != 400 {
			t.Fatalf("%d", r.status)
		}
	}
	up.SetFault(fakeprovider.Fault{SlowFirstToken: 2 * time.Second})
	for i := 0; i < 6; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", p.URL()+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			buf := make([]byte, 1<<10)
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
		}
		cancel()
	}
	// Overflow: one slow request holds the cluster's only slot.
	// The cancelled requests must have left the proxy (and freed the
	// cluster's only slot) first.
	eventually(t, "cancelled requests finish", func() bool { return len(p.Log()) >= 12 })
	// Envoy logs a request before its router frees the cluster slot; a
	// slow request sent in between overflows and never reaches the
	// provider (a CI run at 55223ca).
	eventually(t, "the cluster's slot is free", func() bool { return p.UpstreamActive("openai_us") == 0 })
	before := up.Served()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); chat(t, p, gpt, true) }()
	eventually(t, "the slow request is upstream", func() bool { return up.Served() > before })
	overflowed := 0
	for i := 0; i < 5; i++ {
		if r := chat(t, p, gpt, false); r.status == 503 && r.header.Get("x-envoy-overloaded") == "true" {
			overflowed++
		}
	}
	wg.Wait()
	if overflowed != 5 {
		t.Fatalf("overflowed %d of 5", overflowed)
	}
	eventually(t, "cancelled streams reach the breaker", func() bool {
		return strings.Count(w.scrape(), `reason="client_cancel"`) > 0
	})
	if b := w.admin("/admin/v1/gateways/default/circuit-breaker"); len(b) != 0 {
		t.Fatalf("noise tripped a breaker: %v", b)
	}
	m := w.scrape()
	for _, want := range []string{`reason="client_error"`, `reason="envoy_overflow"`, `reason="client_cancel"`} {
		if !strings.Contains(m, want) {
			t.Errorf("no %s outcome recorded", want)
		}
	}
}

func (w *world) scrape() string {
	resp, err := http.Get("http://" + w.fusebox.AdminAddr() + "/metrics")
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}

// fusebox killed mid-traffic: failure_mode_allow sends requests to the
// default route; restarted, fusebox takes over again.
func TestFuseboxKilledAndRestarted(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil)
	if r := chat(t, p, gpt, false); r.servedBy() != "openai_us" {
		t.Fatalf("%q", r.servedBy())
	}
	w.stopFusebox()
	for i := 0; i < 5; i++ {
		r := chat(t, p, gpt, i%2 == 0)
		if r.status != 200 || r.servedBy() != "fallback" || r.route() != "" {
			t.Fatalf("with fusebox down: %d %q %q", r.status, r.servedBy(), r.route())
		}
	}
	if p.Stats().Get("failure_mode_allowed") == 0 {
		t.Fatal("failure_mode_allow not exercised")
	}
	w.startFusebox()
	eventually(t, "fusebox routes again", func() bool { return chat(t, p, gpt, false).servedBy() == "openai_us" })
}

// A client cannot choose a cluster, a gateway or a route by sending
// fusebox's headers — with fusebox up or down.
func TestClientCannotChooseCluster(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil)
	evil := []string{"x-fusebox-cluster", "gpu_a", "x-fusebox-gateway", "shadow", "x-fusebox-model", "claude"}
	if r := chat(t, p, gpt, false, evil...); r.servedBy() != "openai_us" {
		t.Fatalf("client header chose %q", r.servedBy())
	}
	if r := do(t, p, "GET", "/v1/models", "", evil...); r.status != 200 || !strings.Contains(r.body, `"fallback"`) {
		t.Fatalf("pass-through went to %q", r.body)
	}
	w.stopFusebox()
	if r := chat(t, p, gpt, false, evil...); r.servedBy() != "fallback" {
		t.Fatalf("with fusebox down the client chose %q", r.servedBy())
	}
	if w.providers["gpu_a"].Served() != 0 {
		t.Fatal("the client's cluster was used")
	}
}

// Envoy's route timeout (504 UT) and dead turns on self-hosted routes open
// the breaker; a dead turn elsewhere does not.
func TestTimeoutsAndDeadTurns(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil, func(c *envoysim.Config) { c.RouteTimeout = 300 * time.Millisecond })
	body := `{"model":"llama","stream":true,"messages":[]}`
	w.providers["gpu_a"].SetFault(fakeprovider.Fault{Hang: 2 * time.Second})
	for i := 0; i < 3; i++ {
		if r := do(t, p, "POST", "/v1/chat/completions", body); r.status != 504 {
			t.Fatalf("%d", r.status)
		}
	}
	if b := w.breaker("default", "self:gpu-a:llama"); b["reason"] != "timeout" {
		t.Fatalf("%v", b)
	}
	w.providers["gpu_b"].SetFault(fakeprovider.Fault{DeadTurn: true})
	for i := 0; i < 3; i++ {
		if r := do(t, p, "POST", "/v1/chat/completions", body); r.status != 200 {
			t.Fatalf("%d", r.status)
		}
	}
	if b := w.breaker("default", "self:gpu-b:llama"); b["state"] != "open" || b["reason"] != "dead_turn" {
		t.Fatalf("%v", b)
	}
	w.providers["anthropic_us"].SetFault(fakeprovider.Fault{DeadTurn: true})
	for i := 0; i < 5; i++ {
		do(t, p, "POST", "/v1/messages", `{"model":"claude","stream":true,"max_tokens":8,"messages":[]}`)
	}
	if b := w.breaker("default", "anthropic:us:claude"); b != nil {
		t.Fatalf("a dead turn on a non-self-hosted route tripped: %v", b)
	}
}

// An error event inside a stream and a mid-stream reset are neither.
func TestBrokenStreamsAreNeither(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil)
	w.providers["openai_us"].SetFault(fakeprovider.Fault{ErrorEvent: true})
	for i := 0; i < 4; i++ {
		chat(t, p, gpt, true)
	}
	w.providers["openai_us"].SetFault(fakeprovider.Fault{ResetMidStream: true})
	for i := 0; i < 4; i++ {
		req, _ := http.NewRequest("POST", p.URL()+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","stream":true,"messages":[]}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			buf := make([]byte, 4096)
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
		}
	}
	// The error events are stream_error; each reset is stream_error when
	// Envoy's entry (UR on the 200) reached fusebox before the stream's
	// end, client_cancel when the end came first (R-O9, R-AL4).
	neithers := func() int {
		n := 0
		for _, r := range []string{"stream_error", "client_cancel"} {
			n += metricValue(w.scrape(), `aig_circuit_breaker_outcomes_total{class="neither",gateway="default",origin="",reason="`+r+`",route="openai:us-east:gpt-4o-mini"}`)
		}
		return n
	}
	eventually(t, "the resets reach the breaker", func() bool { return neithers() >= 8 })
	if b := w.breaker("default", "openai:us-east:gpt-4o-mini"); b != nil {
		t.Fatalf("%v", b)
	}
	if n := neithers(); n != 8 || strings.Contains(w.scrape(), `class="failure"`) {
		t.Fatalf("8 broken streams gave %d neithers:\n%s", n, grep(w.scrape(), "outcomes_total"))
	}
}

// Operators can force a route open and closed through the admin API.
func TestForceOpenThroughAdmin(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("default", nil)
	if code := w.post("/admin/v1/gateways/default/routes/openai:us-east:gpt-4o-mini/force-open", `{"duration_sec": 60}`); code != 200 {
		t.Fatalf("%d", code)
	}
	if r := chat(t, p, gpt, false); r.servedBy() != "azure_eu" {
		t.Fatalf("%q", r.servedBy())
	}
	w.clk.Advance(61 * time.Second)
	if r := chat(t, p, gpt, false); r.servedBy() != "openai_us" {
		t.Fatalf("force-open outlived its duration: %q", r.servedBy())
	}
}

// R-T5 end to end: a provider that stalls mid-stream is counted slow while
// the stream still hangs, and the breaker opens on slow_call_rate:stall
// before the stream ends; the next requests go elsewhere.
func TestStallMidStreamOpensWhileItHangs(t *testing.T) {
	w := newWorld(t)
	p := w.proxy("stall", nil)
	up := w.providers["openai_us"]
	release := make(chan struct{})
	up.SetFault(fakeprovider.Fault{StallAfterFirstToken: release})
	done := make(chan reply, 1)
	go func() { done <- chat(t, p, gpt, true) }()
	eventually(t, "the stream is upstream", func() bool { return up.Served() > 0 })
	// The token already sent, the provider is silent; time passes on
	// fusebox's clock until the stall watch sees it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.clk.Advance(6 * time.Second)
		time.Sleep(300 * time.Millisecond)
		if b := w.breaker("stall", "openai:us-east:gpt-4o-mini"); b != nil && b["state"] == "open" {
			if b["reason"] != "slow_call_rate:stall" {
				t.Fatalf("opened for %v", b["reason"])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stalled stream did not open the breaker while it hung:\n%s", w.logs.String())
		}
	}
	select {
	case <-done:
		t.Fatal("the stream ended before the stall was counted: the test proves nothing")
	default:
	}
	close(release)
	if r := <-done; r.status != 200 {
		t.Fatalf("the stalled stream ended with %d", r.status)
	}
	if r := chat(t, p, gpt, false); r.servedBy() != "openai_eu" {
		t.Fatalf("after the stall the next request went to %q", r.servedBy())
	}
}

// A provider whose answers end with HTTP trailers (#35): in the shipped
// trailer mode SKIP, Envoy never sends fusebox a body message with
// end_of_stream, so a complete answer must be judged complete by its own
// framing when the stream ends. Streamed and whole answers count as
// successes, never neithers, in either profile.
func TestTrailersEndAnAnswer(t *testing.T) {
	w := newWorld(t)
	// The observer's stream ends only at its deferred close when no body
	// end comes (shortened from the file's 5 s).
	p := w.proxy("default", nil, func(c *envoysim.Config) {
		if c.Observer != nil {
			c.Observer.DeferredClose = 200 * time.Millisecond
		}
	})
	w.providers["openai_us"].SetFault(fakeprovider.Fault{Trailers: true})
	for i := 0; i < 4; i++ {
		if r := chat(t, p, gpt, i%2 == 0); r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
	}
	if p.Stats().Get("body_end_not_sent") == 0 {
		t.Fatal("envoysim sent the body's end: the scenario proves nothing")
	}
	ok := `aig_circuit_breaker_outcomes_total{class="success",gateway="default",origin="",reason="success",route="openai:us-east:gpt-4o-mini"} 4`
	eventually(t, "four successes", func() bool {
		w.clk.Advance(time.Second)
		return strings.Contains(w.scrape(), ok)
	})
	if m := w.scrape(); strings.Contains(m, `class="neither",gateway="default"`) {
		t.Fatalf("an answer with trailers was a neither:\n%s", grep(m, "outcomes_total"))
	}
}

// metricValue is the value of the series named exactly by series (name and
// labels) in a scrape, 0 when absent.
func metricValue(scrape, series string) int {
	for _, l := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
