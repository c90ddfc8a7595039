package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	"github.com/fusebox-llm/fusebox/test/e2e/logbuf"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// fuseboxConfig is the deployment under test. Clusters are named after the
// fake providers.
const fuseboxConfig = `
policies:
  standard: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 30000}
gateways:
  - id: default
    circuit_breaker: {policy: standard}
    models:
      - name: gpt-4o-mini
        routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini, openai:eu:gpt-4o-mini]
      - name: claude
        routes: [anthropic:us:claude, anthropic:eu:claude]
      - name: llama
        routes: [self:gpu-a:llama, self:gpu-b:llama]
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us, residency: [us]}
      - {key: azure:eu-west:gpt-4o-mini, cluster: azure_eu, residency: [eu], upstream_model: gpt4o-mini-deploy, path: "/openai/deployments/gpt4o-mini-deploy/chat/completions?api-version=2024-10-21"}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu, residency: [eu]}
      - {key: anthropic:us:claude, cluster: anthropic_us, api: anthropic}
      - {key: anthropic:eu:claude, cluster: anthropic_eu, api: anthropic}
      - {key: self:gpu-a:llama, cluster: gpu_a, self_hosted: true}
      - {key: self:gpu-b:llama, cluster: gpu_b, self_hosted: true}
  - id: stall
    circuit_breaker: {policy: standard, stall_ms: 5000, slow_call_rate_percent: 50, minimum_requests: 1}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini, openai:eu:gpt-4o-mini]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
  - id: shadow
    circuit_breaker: {policy: standard, mode: shadow}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini, openai:eu:gpt-4o-mini]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
  - id: failfast
    circuit_breaker: {policy: standard, when_all_open: fail_fast}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini, openai:eu:gpt-4o-mini]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
  - id: failover
    circuit_breaker: {policy: standard}
    failover: {max_attempts: 3}
    models:
      - name: gpt-4o-mini
        routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini, openai:eu:gpt-4o-mini]
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: azure:eu-west:gpt-4o-mini, cluster: azure_eu, upstream_model: gpt4o-mini-deploy, path: "/openai/deployments/gpt4o-mini-deploy/chat/completions?api-version=2024-10-21"}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
  - id: ratelimited
    circuit_breaker: {policy: standard, failure_status_codes: [500, 502, 503, 504]}
    models:
      - {name: gpt-4o-mini, routes: [openai:us-east:gpt-4o-mini, openai:eu:gpt-4o-mini]}
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
`

var providerNames = []string{"openai_us", "azure_eu", "openai_eu", "anthropic_us", "anthropic_eu", "gpu_a", "gpu_b", "fallback"}

// world is fusebox + envoysim + fake providers.
type world struct {
	t         *testing.T
	clk       *breaker.FakeClock
	providers map[string]*fakeprovider.Provider
	cfgPath   string
	grpcAddr  string
	fusebox   *mainlib.Instance
	stop      context.CancelFunc
	logs      *logbuf.Buffer
	proxies   []*envoysim.Proxy
	// profile is the Envoy release and config file the proxies play
	// (versions_test.go); the zero value is envoy.yaml on the current one.
	profile profile
	// args are further flags of every fusebox (a fleet's -redis-url);
	// replicas are the fleet's fusebox processes after the first
	// (fleet_test.go).
	args     []string
	replicas []*replica
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldConfig(t, fuseboxConfig)
}

// newWorldConfig is a world whose fusebox runs on config.
func newWorldConfig(t *testing.T, config string, opts ...func(*world)) *world {
	t.Helper()
	w := &world{t: t, clk: breaker.NewFakeClock(t0), providers: map[string]*fakeprovider.Provider{}, logs: &logbuf.Buffer{}}
	for _, o := range opts {
		o(w)
	}
	w.startProviders()
	w.cfgPath = filepath.Join(t.TempDir(), "fusebox.yaml")
	switch w.profile.File {
	case "":
		config = inProfile(config)
	case "envoy-observer.yaml":
		config = "envoy: {observer: true}\n" + config
	}
	if err := os.WriteFile(w.cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if w.grpcAddr == "" {
		w.grpcAddr = freeAddr(t)
	}
	w.startFusebox()
	t.Cleanup(func() {
		for _, p := range w.proxies {
			p.Close()
		}
		for _, r := range w.replicas {
			r.stop()
		}
		w.stopFusebox()
		if t.Failed() {
			t.Logf("fusebox log:\n%s", w.logs.String())
		}
	})
	return w
}

// startProviders starts one fake provider per cluster, closed with the
// test.
func (w *world) startProviders() {
	w.t.Helper()
	for _, n := range providerNames {
		p, err := fakeprovider.Start(n)
		if err != nil {
			w.t.Fatal(err)
		}
		w.providers[n] = p
		w.t.Cleanup(p.Close)
	}
}

func (w *world) startFusebox() {
	w.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in, err := mainlib.Start(ctx, append([]string{"-config", w.cfgPath, "-grpc-addr", w.grpcAddr, "-admin-addr", "127.0.0.1:0", "-grace-period", "0s"}, w.args...),
		w.logs, mainlib.WithClock(w.clk), mainlib.WithOverlayCache(""))
	if err != nil {
		cancel()
		w.t.Fatal(err)
	}
	w.fusebox, w.stop = in, cancel
}

// stopFusebox kills fusebox (its listeners close; in-flight streams end).
func (w *world) stopFusebox() {
	if w.fusebox == nil {
		return
	}
	w.stop()
	_ = w.fusebox.Wait()
	w.fusebox = nil
}

// deployment is the shipped Envoy deployment for one virtual host (one
// gateway). envoy_test.go checks it against envoy/envoy.yaml.
func (w *world) deployment(gateway string, vhostHeaders map[string]string) envoysim.Config {
	cfg := deploymentOf(w.t, w.profile.file())
	cfg.Envoy = w.profile.Envoy
	cfg.Gateway = gateway
	cfg.VHostHeaders = vhostHeaders
	cfg.ExtProc.Addr = w.grpcAddr
	if cfg.Observer != nil {
		cfg.Observer.Addr = w.grpcAddr
	}
	if cfg.AccessLog != nil {
		cfg.AccessLog.Addr = w.grpcAddr
	}
	// The clusters of this test topology: one per fake provider, each with
	// the file's provider cluster thresholds (max_requests, max_retries:
	// envoysim plays what the file tells Envoy), and the file's default
	// cluster served by the "fallback" provider.
	tmpl := envoysim.Cluster{MaxRequests: 1024}
	if c := cfg.Clusters["openai_us_east"]; c != nil {
		tmpl = *c
	}
	cfg.Clusters = map[string]*envoysim.Cluster{}
	for n, p := range w.providers {
		c := tmpl
		c.Addr = p.Addr()
		cfg.Clusters[n] = &c
	}
	cfg.ServeDefaultsFrom(envoysim.Cluster{Addr: w.providers["fallback"].Addr(), MaxRequests: 1024})
	return cfg
}

func (w *world) proxy(gateway string, vhostHeaders map[string]string, mod ...func(*envoysim.Config)) *envoysim.Proxy {
	w.t.Helper()
	cfg := w.deployment(gateway, vhostHeaders)
	for _, m := range mod {
		m(&cfg)
	}
	return w.startProxy(cfg)
}

// startProxy starts envoysim on cfg, closed with the world.
//
// Every ext_proc message timeout below 10 s is lifted to 10 s: these
// scenarios judge what fusebox decides, and the shipped files' 0.2–0.5 s
// are production latency bounds, which the soak (test/soak, the files'
// own timeouts) and the benchmarks measure. On a busy 2-core machine
// under -race a reply can miss them, and failure_mode_allow then sends
// the request to Envoy's default route: a red test that judged the
// machine (#54). envoysim still plays each timeout exactly
// (envoysim/TestMessageTimeoutEvents).
func (w *world) startProxy(cfg envoysim.Config) *envoysim.Proxy {
	w.t.Helper()
	lift := func(c *envoysim.ExtProcConfig) {
		if c != nil && c.MessageTimeout < scenarioMessageTimeout {
			c.MessageTimeout = scenarioMessageTimeout
		}
	}
	lift(&cfg.ExtProc)
	lift(cfg.Observer)
	if cfg.Failover != nil {
		lift(&cfg.Failover.Attempt)
	}
	p, err := envoysim.New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := p.Start("127.0.0.1:0"); err != nil {
		w.t.Fatal(err)
	}
	w.proxies = append(w.proxies, p)
	return p
}

// scenarioMessageTimeout is the ext_proc message timeout of the e2e
// scenarios (startProxy).
const scenarioMessageTimeout = 10 * time.Second

// reply is what a client received.
type reply struct {
	status int
	header http.Header
	body   string
}

// entry is r's access log entry: found by the request id r carries, not
// by its place in the log (envoysim/logwait.go). do waited for it.
func (r reply) entry(t *testing.T, p *envoysim.Proxy) envoysim.Entry {
	t.Helper()
	e, ok := p.Logged(r.header.Get(envoysim.RequestHeader))
	if !ok {
		t.Fatalf("no access log entry for request %q", r.header.Get(envoysim.RequestHeader))
	}
	return e
}

func (r reply) route() string { return r.header.Get("x-fusebox-route") }

// servedBy reads which fake provider answered.
func (r reply) servedBy() string { return r.header.Get("X-Served-By") }

func do(t *testing.T, p *envoysim.Proxy, method, path, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, p.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// The observer profile records a response after the client has it:
	// wait for it, so that what a test reads next follows the response, as
	// in the synchronous profile. Envoy writes the access log entry after
	// the response's last byte too: wait for it, so that the log a test
	// reads next holds this request.
	id := resp.Header.Get(envoysim.RequestHeader)
	p.WaitObserver(id, 3*time.Second)
	if _, ok := p.WaitLogged(id, 10*time.Second); !ok {
		t.Fatalf("%s %s: request %q was never logged", method, path, id)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func chat(t *testing.T, p *envoysim.Proxy, model string, stream bool, hdr ...string) reply {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
	return do(t, p, "POST", "/v1/chat/completions", body, hdr...)
}

// admin reads the status API.
func (w *world) admin(path string) map[string]map[string]any {
	w.t.Helper()
	resp, err := http.Get("http://" + w.fusebox.AdminAddr() + path)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		w.t.Fatalf("admin %s: %v", path, err)
	}
	return v
}

func (w *world) post(path, body string) int {
	w.t.Helper()
	resp, err := http.Post("http://"+w.fusebox.AdminAddr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (w *world) breaker(gateway, route string) map[string]any {
	return w.admin("/admin/v1/gateways/" + gateway + "/circuit-breaker")[route]
}

// eventually polls cond: used only for asynchronous effects (a stream's end
// reaching the breaker, a gRPC reconnect), never for cooldowns.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallySays(t, what, cond, func() string { return "" })
}

// eventuallyLive is eventuallySays for a wait through the store: while it
// waits, the world's clock follows the wall clock, as a deployment's does.
// A store call that timed out (a loaded machine's Redis blip) is sent
// again on the clock (lifecycle.Notes.Resend, the parks' rewrites); on a
// clock that stands still it never is, and the outcome never lands. The
// clock moves at most 15 s: under every cooldown of fuseboxConfig.
func (w *world) eventuallyLive(what string, cond func() bool, state func() string) {
	w.t.Helper()
	last := time.Now()
	eventuallySays(w.t, what, func() bool {
		now := time.Now()
		w.clk.Advance(now.Sub(last))
		last = now
		return cond()
	}, state)
}

// eventuallySays is eventually whose failure also says what state says.
func eventuallySays(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s%s", what, state())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
