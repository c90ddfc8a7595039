package browser

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

const incidentConfig = `
gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 600000}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us_east}
      - {key: azure:eu-west:gpt-4o-mini, cluster: azure_eu_west}
  - id: trial
    circuit_breaker: {enabled: true, mode: shadow, failure_threshold: 3, window_sec: 60, cooldown_ms: 600000}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us_east}
      - {key: azure:eu-west:gpt-4o-mini, cluster: azure_eu_west}
`

// answer sends one request of gateway gw (with more request headers, kv)
// through the ext_proc stream; the upstream answers status.
func answer(t *testing.T, conn *grpc.ClientConn, gw, status string, kv ...string) {
	t.Helper()
	answerWith(t, conn, gw, status, kv, nil)
}

// answerWith is answer with the response headers resp as well.
func answerWith(t *testing.T, conn *grpc.ClientConn, gw, status string, kv, resp []string) {
	t.Helper()
	answerAttrs(t, conn, gw, status, kv, resp, nil)
}

// answerAttrs is answerWith with Envoy's attributes on the response
// headers (its flags and details: how the attempt ended).
func answerAttrs(t *testing.T, conn *grpc.ClientConn, gw, status string, kv, resp []string, attrs map[string]*structpb.Struct) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := func(kv ...string) *corev3.HeaderMap {
		m := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return m
	}
	_ = s.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: h(append([]string{":method", "POST", "x-fusebox-gateway", gw, "x-fusebox-model", "gpt-4o-mini"}, kv...)...), EndOfStream: true}},
	})
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = s.Send(&extprocv3.ProcessingRequest{Attributes: attrs, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: h(append([]string{":status", status}, resp...)...), EndOfStream: true}}})
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseSend()
	_, _ = s.Recv()
}

// startOn runs fusebox on config with no admin token (loopback), and a gRPC
// connection to it.
func startOn(t *testing.T, config string, opts ...mainlib.Option) (*mainlib.Instance, *grpc.ClientConn) {
	t.Helper()
	t.Setenv("FUSEBOX_ADMIN_TOKEN", "")
	cfg := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in, err := mainlib.Start(ctx, []string{"-config", cfg, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-grace-period", "0s", "-log-level", "warn"}, io.Discard, opts...)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); cancel(); _ = in.Wait() })
	return in, conn
}

// TestIncidentView (R-API7): the dashboard loads with no token on a
// loopback listener; its summary says per gateway and model how many
// routes are healthy and which degradation is in force; a card with an
// unhealthy route opens by itself; a shadow breaker is drawn "would skip",
// never red; the timeline says which route changed, on what evidence, and
// what handled the next request.
func TestIncidentView(t *testing.T) {
	exe := chromium(t)
	shots := artifacts(t)
	in, conn := startOn(t, incidentConfig)
	ctx := t.Context()
	bctx, shot := newBrowser(t, ctx, exe, shots, "incident-")
	summary := func(gw string) string { return `#summary tr[data-gateway="` + gw + `"]` }
	const bad, good = "openai:us-east:gpt-4o-mini", "azure:eu-west:gpt-4o-mini"

	// No token: the page works at once.
	var healthy string
	must(t, chromedp.Run(bctx,
		chromedp.Navigate("http://"+in.AdminAddr()+"/dashboard"),
		chromedp.WaitVisible(summary("default"), chromedp.ByQuery),
		chromedp.Text(summary("default")+` td:nth-child(3)`, &healthy, chromedp.ByQuery),
		shot("1-healthy"),
	), "load without a token")
	if healthy != "2 / 2" {
		t.Fatalf("healthy routes %q, want 2 / 2", healthy)
	}

	// An outage of the first route: 3 failures open it; the next request
	// goes to azure.
	for range 3 {
		answer(t, conn, "default", "503")
		answer(t, conn, "trial", "503")
	}
	answer(t, conn, "default", "200")
	card := `section.gateway[data-gateway="default"]`
	var open bool
	var inForce, stateText, shadowText, timeline string
	must(t, chromedp.Run(bctx,
		chromedp.Poll(`document.querySelector('`+summary("default")+` td:nth-child(3)').textContent === "1 / 2"`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.WaitVisible(card+` tr[data-route="`+bad+`"] td.state[data-state="open"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('`+card+` details').open`, &open),
		chromedp.Text(summary("default")+` td:nth-child(4)`, &inForce, chromedp.ByQuery),
		chromedp.Text(card+` tr[data-route="`+bad+`"] td.state`, &stateText, chromedp.ByQuery),
		chromedp.Click(`section.gateway[data-gateway="trial"] summary`, chromedp.ByQuery),
		chromedp.WaitVisible(`section.gateway[data-gateway="trial"] tr[data-route="`+bad+`"] td.state-would`, chromedp.ByQuery),
		chromedp.Text(`section.gateway[data-gateway="trial"] tr[data-route="`+bad+`"] td.state`, &shadowText, chromedp.ByQuery),
		chromedp.Poll(`[...document.querySelectorAll('#timeline li')].some(li => li.textContent.includes("next request: model gpt-4o-mini → `+good+`"))`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Text(`#timeline`, &timeline, chromedp.ByQuery),
		shot("2-outage"),
	), "the outage")
	if !open {
		t.Error("the card with an unhealthy route was not expanded")
	}
	// One route skipped is not "routing as usual" (#37: it said so while
	// routing passed over the open route).
	if !strings.Contains(inForce, "skipping unhealthy routes") {
		t.Errorf("in force with one route left: %q", inForce)
	}
	if !strings.Contains(stateText, "open") || strings.Contains(stateText, "would") {
		t.Errorf("the prod breaker reads %q", stateText)
	}
	if !strings.Contains(shadowText, "would skip") {
		t.Errorf("the shadow breaker reads %q, want would skip", shadowText)
	}
	for _, want := range []string{"default / " + bad + ": closed->open", "reason provider_5xx", "window 3 calls, 3 failures", "policy "} {
		if !strings.Contains(timeline, want) {
			t.Errorf("the timeline lacks %q:\n%s", want, timeline)
		}
	}
	var trialHealthy string
	must(t, chromedp.Run(bctx, chromedp.Text(summary("trial")+` td:nth-child(3)`, &trialHealthy, chromedp.ByQuery)), "trial summary")
	if trialHealthy != "2 / 2" {
		t.Errorf("a shadow breaker counted as unhealthy: %q", trialHealthy)
	}

	// The second route fails too: every route unhealthy, try_all in force.
	for range 3 {
		answer(t, conn, "default", "503")
	}
	must(t, chromedp.Run(bctx,
		chromedp.Poll(`document.querySelector('`+summary("default")+` td:nth-child(4)').dataset.degradation === "try_all"`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		shot("3-all-open"),
	), "all open")
	t.Logf("screenshots in %s", shots)
}

// R-D8 in the dashboard: a route on its recovery ramp is drawn apart, with
// its share.
func TestRampingRouteInDashboard(t *testing.T) {
	exe := chromium(t)
	shots := artifacts(t)
	ramping := strings.Replace(incidentConfig, "cooldown_ms: 600000}", "cooldown_ms: 1000, recovery_ramp_sec: 3600, recovery_ramp_start_percent: 25}", 1)
	clk := breaker.NewFakeClock(time.Now())
	in, conn := startOn(t, ramping, mainlib.WithClock(clk))
	ctx := t.Context()
	for range 3 {
		answer(t, conn, "default", "503")
	}
	clk.Advance(2 * time.Second)      // past the 1 s cooldown: half-open
	answer(t, conn, "default", "200") // the probe closes it: the ramp begins
	bctx, shot := newBrowser(t, ctx, exe, shots, "ramp-")
	card := `section.gateway[data-gateway="default"]`
	var text string
	must(t, chromedp.Run(bctx,
		chromedp.Navigate("http://"+in.AdminAddr()+"/dashboard"),
		chromedp.WaitVisible(card+` summary`, chromedp.ByQuery),
		chromedp.Click(card+` summary`, chromedp.ByQuery),
		chromedp.WaitVisible(card+` tr[data-route="openai:us-east:gpt-4o-mini"] td.state-ramp`, chromedp.ByQuery),
		chromedp.Text(card+` tr[data-route="openai:us-east:gpt-4o-mini"] td.state`, &text, chromedp.ByQuery),
		shot("1-ramping"),
	), "ramping route")
	if !strings.Contains(text, "ramping: 25 %") {
		t.Fatalf("the ramping route reads %q", text)
	}
}

// R-H4: a route whose provider announced less quota than the headroom
// floor reads "saturated" in its card, with how long it stays so.
func TestSaturatedRouteInDashboard(t *testing.T) {
	exe := chromium(t)
	shots := artifacts(t)
	cfg := strings.Replace(incidentConfig, "cooldown_ms: 600000}", "cooldown_ms: 600000, headroom: {min_requests: 5}}", 1)
	in, conn := startOn(t, cfg)
	answerWith(t, conn, "default", "200", nil, []string{"x-ratelimit-remaining-requests", "2", "x-ratelimit-reset-requests", "50s"})
	bctx, shot := newBrowser(t, t.Context(), exe, shots, "saturated-")
	card := `section.gateway[data-gateway="default"]`
	row := card + ` tr[data-route="openai:us-east:gpt-4o-mini"]`
	var state, rowText string
	must(t, chromedp.Run(bctx,
		chromedp.Navigate("http://"+in.AdminAddr()+"/dashboard"),
		chromedp.WaitVisible(card+` summary`, chromedp.ByQuery),
		chromedp.Click(card+` summary`, chromedp.ByQuery),
		chromedp.WaitVisible(row+` td.state-saturated`, chromedp.ByQuery),
		chromedp.Text(row+` td.state`, &state, chromedp.ByQuery),
		chromedp.Text(row, &rowText, chromedp.ByQuery),
		shot("1-saturated"),
	), "saturated route")
	if !strings.Contains(state, "saturated") || !strings.Contains(rowText, "saturated for") {
		t.Fatalf("the saturated route reads %q / %q", state, rowText)
	}
}

// R-API7's picture of the last minutes (#37): per route, the requests of
// the last 15 minutes per 10 s with the failures apart, and the breaker's
// state behind them as bands, on a time axis in minutes before now. An
// outage four minutes in, open for its one-minute cooldown, closed by the
// probe the next request after it made: the chart of
// the first route shows an open band where the failures were, then closed;
// the second route's has no band.
func TestIncidentChart(t *testing.T) {
	exe := chromium(t)
	shots := artifacts(t)
	cfg := strings.Replace(incidentConfig, "cooldown_ms: 600000}", "cooldown_ms: 60000}", 1)
	start := time.Now().Truncate(10 * time.Second)
	clk := breaker.NewFakeClock(start)
	in, conn := startOn(t, cfg, mainlib.WithClock(clk))
	const bad, good = "openai:us-east:gpt-4o-mini", "azure:eu-west:gpt-4o-mini"
	for range 24 { // 4 minutes of traffic, one request per 10 s
		answer(t, conn, "default", "200")
		clk.Advance(10 * time.Second)
	}
	for range 3 { // the outage: 3 failures open the first route
		answer(t, conn, "default", "503")
		clk.Advance(time.Second)
	}
	for range 12 { // 2 minutes on the second route
		answer(t, conn, "default", "200")
		clk.Advance(10 * time.Second)
	}
	answer(t, conn, "default", "200") // past the cooldown: the probe closes it
	for range 6 {
		clk.Advance(10 * time.Second)
		answer(t, conn, "default", "200")
	}

	bctx, shot := newBrowser(t, t.Context(), exe, shots, "chart-")
	card := `section.gateway[data-gateway="default"]`
	fig := func(route string) string { return card + ` figure.route-chart[data-route="` + route + `"]` }
	var openBands, goodBands, bars int
	var openX, openW float64
	var caption, source string
	must(t, chromedp.Run(bctx,
		chromedp.Navigate("http://"+in.AdminAddr()+"/dashboard"),
		chromedp.WaitVisible(card+` summary`, chromedp.ByQuery),
		chromedp.Click(card+` summary`, chromedp.ByQuery),
		chromedp.WaitVisible(fig(bad)+` svg`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('`+fig(bad)+` rect.band[data-state="open"]').length`, &openBands),
		chromedp.Evaluate(`Number(document.querySelector('`+fig(bad)+` rect.band[data-state="open"]')?.getAttribute("x"))`, &openX),
		chromedp.Evaluate(`Number(document.querySelector('`+fig(bad)+` rect.band[data-state="open"]')?.getAttribute("width"))`, &openW),
		chromedp.Evaluate(`document.querySelectorAll('`+fig(good)+` rect.band[data-state="open"], `+fig(good)+` rect.band[data-state="half_open"]').length`, &goodBands),
		chromedp.Evaluate(`document.querySelectorAll('`+fig(bad)+` rect.bar').length`, &bars),
		chromedp.Text(fig(bad)+` figcaption`, &caption, chromedp.ByQuery),
		chromedp.Text(card+` .chart-source`, &source, chromedp.ByQuery),
		chromedp.ScrollIntoView(fig(bad), chromedp.ByQuery),
		shot("1-after-an-outage"),
	), "the chart")
	// The chart spans 15 minutes in 540 px: 36 px a minute. The outage
	// began 4 min into traffic that ended about 7 min after it began, so
	// the open band starts about 4 min before the traffic's end, ~11 min
	// before now, and lasts about the 1-minute cooldown.
	elapsed := clk.Now().Sub(start).Minutes()
	wantX := (15 - elapsed + 4) * 36
	if openBands != 1 || openX < wantX-10 || openX > wantX+10 || openW < 36-8 || openW > 36+8 {
		t.Errorf("the open band: %d bands, x %.0f (want about %.0f), width %.0f (want about 36)", openBands, openX, wantX, openW)
	}
	if goodBands != 0 {
		t.Errorf("the route that stayed closed has %d state bands", goodBands)
	}
	if bars < 20 {
		t.Errorf("%d request bars on the first route", bars)
	}
	if !strings.Contains(caption, "3 failures") || !strings.Contains(caption, "closed") {
		t.Errorf("the caption: %q", caption)
	}
	if !strings.Contains(source, "transitions") {
		t.Errorf("the chart does not say whose transitions it shows: %q", source)
	}
	t.Logf("screenshots in %s", shots)
}
