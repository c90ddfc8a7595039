package e2e

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// newFailoverWorld is a world whose fusebox is told it runs behind the
// failover deployment (envoy.failover: true, R-X8).
func newFailoverWorld(t *testing.T, opts ...func(*world)) *world {
	t.Helper()
	return newWorldConfig(t, "envoy: {failover: true}\n"+fuseboxConfig, opts...)
}

// failoverProxy plays envoy/envoy-failover.yaml (Envoy >= 1.40) for the
// "failover" gateway: route (a) through the priority_group specifier, the
// attempt role in every provider cluster's upstream chain, each cluster's
// own credential header.
func (w *world) failoverProxy() *envoysim.Proxy {
	w.t.Helper()
	return w.startProxy(w.failoverConfig())
}

// failoverConfig is the deployment failoverProxy plays.
func (w *world) failoverConfig() envoysim.Config {
	w.t.Helper()
	cfg := deploymentOf(w.t, "../../envoy/envoy-failover.yaml")
	if cfg.Failover == nil || cfg.Failover.Attempt.InitialMetadata["x-fusebox-role"] != "attempt" {
		w.t.Fatalf("envoy-failover.yaml does not play as a failover deployment: %+v", cfg.Failover)
	}
	fo := cfg.Failover
	fileCreds := fo.Credentials
	cfg.Gateway = "failover"
	cfg.ExtProc.Addr = w.grpcAddr
	fo.Attempt.Addr = w.grpcAddr
	if cfg.AccessLog != nil {
		cfg.AccessLog.Addr = w.grpcAddr
	}
	// Each fake provider is a provider cluster of the file, with the
	// file's circuit breakers (max_requests, the retry budget).
	tmpl := *cfg.Clusters["openai_us_east"]
	cfg.Clusters = map[string]*envoysim.Cluster{}
	for n, p := range w.providers {
		c := tmpl
		c.Addr = p.Addr()
		cfg.Clusters[n] = &c
	}
	cfg.ServeDefaultsFrom(envoysim.Cluster{Addr: w.providers["fallback"].Addr(), MaxRequests: 1024})
	// The file's clusters are the real providers'; here each fake provider
	// gets the credential header of its kind, as the file injects them.
	header := map[string]string{}
	for c, cred := range fileCreds {
		header[strings.Split(c, "_")[0]] = cred[0]
	}
	fo.Credentials = map[string][2]string{}
	for n := range w.providers {
		if h, ok := header[strings.Split(n, "_")[0]]; ok {
			fo.Credentials[n] = [2]string{h, "secret-" + n}
		}
	}
	fo.Groups = []string{"openai_us"}
	return cfg
}

// With failover on, an outage at the first route costs the client nothing:
// each failed attempt is retried on the next route of fusebox's chain (with
// that route's path, model and credential), the failed attempts still open
// the breaker after failure_threshold of them, and once it is open the dead
// provider gets no attempts at all.
func TestFailoverHidesAnOutage(t *testing.T) {
	cases := []struct {
		name   string
		fault  func(w *world, p *fakeprovider.Provider)
		reason string
		perTry time.Duration // the route's per_try_timeout, shortened here from the file's 60 s
	}{
		{"provider 503", func(_ *world, p *fakeprovider.Provider) { p.SetFault(fakeprovider.Fault{Status: 503}) }, "provider_5xx", 0},
		{"connection refused", func(_ *world, p *fakeprovider.Provider) { p.Down() }, "connection_error", 0},
		// A provider that never answers: the router's per-try timer resets
		// the attempt and retries it (#35). fusebox runs on the world's
		// fake clock, so each hung request moves it past the per-try
		// timeout the router announced.
		{"provider hangs", func(w *world, p *fakeprovider.Provider) {
			p.SetFault(fakeprovider.Fault{Hang: time.Minute, OnRequest: func() { w.clk.Advance(time.Second) }})
		}, "timeout", 300 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newFailoverWorld(t)
			cfg := w.failoverConfig()
			if tc.perTry > 0 {
				if cfg.Failover.PerTryTimeout == 0 {
					t.Fatal("envoy-failover.yaml sets no per_try_timeout: a hung provider is never failed over")
				}
				cfg.Failover.PerTryTimeout = tc.perTry
			}
			p := w.startProxy(cfg)
			if r := chat(t, p, gpt, false); r.status != 200 || r.servedBy() != "openai_us" {
				t.Fatalf("healthy: %d %q", r.status, r.servedBy())
			}
			p.Attempts()
			tc.fault(w, w.providers["openai_us"])
			for i := 0; i < 10; i++ {
				r := chat(t, p, gpt, i%2 == 0)
				if r.status != 200 || r.servedBy() != "azure_eu" || r.route() != "azure:eu-west:gpt-4o-mini" {
					t.Fatalf("request %d: %d from %q route %q: %s", i, r.status, r.servedBy(), r.route(), r.body)
				}
				if i == 0 {
					// Attempt 2 went to azure with azure's rewrites and
					// azure's credential only.
					hdr, model := w.providers["azure_eu"].LastRequest()
					if model != "gpt4o-mini-deploy" {
						t.Fatalf("attempt 2's model %q", model)
					}
					if path := w.providers["azure_eu"].LastPath(); path != "/openai/deployments/gpt4o-mini-deploy/chat/completions?api-version=2024-10-21" {
						t.Fatalf("attempt 2's path %q", path)
					}
					if hdr.Get("Authorization") != "" || hdr.Get("Api-Key") != "secret-azure_eu" {
						t.Fatalf("attempt 2's credentials: authorization %q api-key %q", hdr.Get("Authorization"), hdr.Get("Api-Key"))
					}
					// R-X10: the attempt header tells the provider nothing
					// of the tenant, the client's path or the other routes.
					tok := hdr.Get("X-Fusebox-Attempt")
					raw, _ := base64.RawURLEncoding.DecodeString(tok)
					for _, secret := range []string{"failover", "/v1/chat/completions", "openai:us-east", "openai_us", "gpt-4o-mini"} {
						if tok == "" || strings.Contains(tok+string(raw), secret) {
							t.Fatalf("the attempt header %q reaching azure carries %q", tok, secret)
						}
					}
				}
			}
			// Three failed attempts opened the breaker; every later request
			// went straight to azure.
			eventually(t, "the breaker opens", func() bool {
				b := w.breaker("failover", "openai:us-east:gpt-4o-mini")
				return b != nil && b["state"] == "open" && b["reason"] == tc.reason
			})
			toDead := func() int {
				n := 0
				for _, a := range p.Attempts() {
					if a.Cluster == "openai_us" {
						n++
					}
				}
				return n
			}
			// The third failure opens it. A refused attempt is recorded off
			// the request path, when the request's next attempt arrives
			// (meet.go: a slow store must not delay it), so the next
			// request's decision may come before that record lands: one
			// attempt more, never two (with both cores busy, CI saw 4).
			if n := toDead(); n < 3 || n > 4 {
				t.Fatalf("%d attempts went to the failing provider, want failure_threshold=3 (and one more at most, before the third was recorded)", n)
			}
			// And none once it is open.
			for i := 0; i < 5; i++ {
				if r := chat(t, p, gpt, false); r.status != 200 || r.servedBy() != "azure_eu" {
					t.Fatalf("after the open: %d from %q", r.status, r.servedBy())
				}
			}
			if n := toDead(); n != 0 {
				t.Fatalf("%d attempts went to the failing provider after it opened", n)
			}
			// On the observer profile the success is recorded at the
			// response's end, which the client may see first: wait for the
			// count, then hold it to exactly one per request.
			const azureOK = `aig_circuit_breaker_outcomes_total{class="success",gateway="failover",origin="",reason="success",route="azure:eu-west:gpt-4o-mini"} `
			counted := func() string {
				for _, l := range strings.Split(w.scrape(), "\n") {
					if strings.HasPrefix(l, azureOK) {
						return strings.TrimPrefix(l, azureOK)
					}
				}
				return ""
			}
			deadline := time.Now().Add(15 * time.Second)
			for counted() != "15" && time.Now().Before(deadline) {
				if n, _ := strconv.Atoi(counted()); n > 15 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if m := w.scrape(); counted() != "15" {
				t.Errorf("azure's successes are not counted once each:\n%s", grep(m, "outcomes_total"))
			}
		})
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A half-open probe that fails is retried on the next route: the client
// sees no error, and the breaker opens again.
func TestFailoverRetriesAFailedProbe(t *testing.T) {
	w := newFailoverWorld(t)
	p := w.failoverProxy()
	w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
	for i := 0; i < 3; i++ {
		chat(t, p, gpt, false)
	}
	eventually(t, "open", func() bool { return w.breaker("failover", "openai:us-east:gpt-4o-mini")["state"] == "open" })
	w.clk.Advance(31 * time.Second)
	p.Attempts()
	r := chat(t, p, gpt, false)
	if r.status != 200 || r.servedBy() != "azure_eu" {
		t.Fatalf("the failed probe reached the client: %d from %q", r.status, r.servedBy())
	}
	if a := p.Attempts(); len(a) != 2 || a[0].Cluster != "openai_us" || a[1].Cluster != "azure_eu" {
		t.Fatalf("attempts %+v, want the probe then azure", a)
	}
	eventually(t, "reopened", func() bool {
		b := w.breaker("failover", "openai:us-east:gpt-4o-mini")
		return b["state"] == "open" && b["reopens"] == 1.0 && b["probes_in_flight"] == 0.0
	})
}

// A 200 stream that breaks mid-flight is not retried: its headers went to
// the client, which sees a broken stream; one attempt only.
func TestFailoverNeverRetriesAfterHeaders(t *testing.T) {
	w := newFailoverWorld(t)
	p := w.failoverProxy()
	w.providers["openai_us"].SetFault(fakeprovider.Fault{ResetMidStream: true})
	p.Attempts()
	r := chat(t, p, gpt, true)
	if r.status != 200 || r.servedBy() != "openai_us" || strings.Contains(r.body, "[DONE]") {
		t.Fatalf("a broken stream: %d from %q, body %q", r.status, r.servedBy(), r.body)
	}
	if a := p.Attempts(); len(a) != 1 {
		t.Fatalf("%d attempts for a stream broken after its headers", len(a))
	}
}

// TestFailoverRecordsItsLastAttempt (R-AL5): when every route refuses, the
// last attempt's connect failure reaches no ext_proc stream (its stream is
// just reset and no attempt follows); Envoy's access log entry records it
// as a connection error at once, not as the neither it would become after
// the park time.
func TestFailoverRecordsItsLastAttempt(t *testing.T) {
	w := newFailoverWorld(t)
	p := w.failoverProxy()
	for _, n := range []string{"openai_us", "azure_eu", "openai_eu"} {
		w.providers[n].Down()
	}
	if r := chat(t, p, gpt, false); r.status != 503 {
		t.Fatalf("every route refusing: %d", r.status)
	}
	attempts := p.Attempts()
	last := attempts[len(attempts)-1]
	series := `aig_circuit_breaker_outcomes_total{class="failure",gateway="failover",origin="local",reason="connection_error",route="openai:eu:gpt-4o-mini"}`
	eventually(t, "the last attempt's connect failure is recorded", func() bool {
		m := w.scrape()
		// Attempts 3..n all went to route 3; each one is a connection error.
		return strings.Contains(m, series+" "+fmt.Sprint(len(attempts)-2))
	})
	// The world's clock stands still: the park time never passed, so the
	// entry recorded it (the entry's own event, or the park's that found
	// the entry first). Said by fusebox's own count, not the wall clock (a
	// bound of 4 s was a loaded machine's to break).
	if m := w.scrape(); strings.Contains(m, `fusebox_decision_events_total{event="expire"`) {
		t.Fatalf("the last attempt was recorded by its park's expiry, not its entry:\n%s", grepLines(m, "fusebox_decision_events_total"))
	}
	if last.Cluster != "openai_eu" {
		t.Fatalf("last attempt on %s", last.Cluster)
	}
	for _, r := range []string{"client_cancel", "no_outcome"} {
		if strings.Contains(w.scrape(), `class="neither",gateway="failover",origin="",reason="`+r+`"`) {
			t.Fatalf("an attempt was recorded as a neither (%s)", r)
		}
	}
}

// TestFailoverAttemptsCappedByMaxAttempts (R-X6): with every route failing,
// a request makes at most max_attempts attempts, one per route of its
// chain, and exactly one with max_attempts 1. Before, envoy-failover.yaml's
// num_retries 9 made 10 attempts whatever max_attempts said, 8 of them on
// the last route (a 10x retry storm with max_attempts 1).
func TestFailoverAttemptsCappedByMaxAttempts(t *testing.T) {
	for _, maxAttempts := range []int{3, 2, 1} {
		t.Run(fmt.Sprintf("max_attempts %d", maxAttempts), func(t *testing.T) {
			w := newFailoverWorld(t)
			p := w.failoverProxy()
			patch := fmt.Sprintf(`{"failover": {"max_attempts": %d}}`, maxAttempts)
			req, _ := http.NewRequest("PATCH", "http://"+w.fusebox.AdminAddr()+"/admin/v1/gateways/failover", strings.NewReader(patch))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("patch: %v %v", err, resp)
			}
			resp.Body.Close()
			for _, n := range []string{"openai_us", "azure_eu", "openai_eu"} {
				w.providers[n].SetFault(fakeprovider.Fault{Status: 503})
			}
			if r := chat(t, p, gpt, false); r.status != 503 {
				t.Fatalf("every route failing: %d", r.status)
			}
			attempts := p.Attempts()
			if len(attempts) != maxAttempts {
				t.Fatalf("%d attempts (%v), want max_attempts=%d", len(attempts), attempts, maxAttempts)
			}
			seen := map[string]bool{}
			for _, a := range attempts {
				if seen[a.Cluster] {
					t.Fatalf("route %s tried twice: %v", a.Cluster, attempts)
				}
				seen[a.Cluster] = true
			}
			// A client cannot widen it: Envoy strips x-envoy-max-retries.
			chat(t, p, gpt, false, "x-envoy-max-retries", "9")
			if n := len(p.Attempts()); n != maxAttempts {
				t.Fatalf("a client's x-envoy-max-retries made %d attempts", n)
			}
		})
	}
}

// TestFailoverAtLoad (R-X9): 240 concurrent requests meet an outage of
// route 1 (every attempt a 503) while route 2 is healthy but takes 300 ms:
// every retry holds its slot that long. With the shipped retry budget no
// client sees an error and the breaker opens. The shipped file before
// (max_retries: 3 on every provider cluster) is the baseline of the same
// run: most requests of the wave got no retry and saw the 503.
func TestFailoverAtLoad(t *testing.T) {
	const n = 240
	cases := []struct {
		name   string
		before bool // play the old circuit breakers: max_retries 3, no budget
	}{
		{"shipped retry_budget", false},
		{"before: max_retries 3", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newFailoverWorld(t)
			cfg := w.failoverConfig()
			if !tc.before {
				if b := cfg.Clusters["openai_us"].RetryBudget; b == nil || b.MinConcurrency < n {
					t.Fatalf("envoy-failover.yaml's provider clusters have no retry budget for %d requests: %+v", n, b)
				}
			} else {
				for _, c := range cfg.Clusters {
					c.RetryBudget, c.MaxRetries = nil, 3
				}
			}
			// The question is the retry budget, not fusebox's latency: on a
			// busy 2-core machine under -race, 240 requests at once can
			// keep fusebox past the file's 0.5 s message timeout, and
			// failure_mode_allow then sends the whole wave to the default
			// route (no attempt on route 1, nothing to open the breaker:
			// it failed 3 of 4 runs with both cores kept busy). The file's
			// timeout is a production bound; here it is the test's.
			cfg.ExtProc.MessageTimeout = 10 * time.Second
			cfg.Failover.Attempt.MessageTimeout = 10 * time.Second
			p := w.startProxy(cfg)
			w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
			w.providers["azure_eu"].SetFault(fakeprovider.Fault{SlowFirstToken: 300 * time.Millisecond})
			errs := 0
			for _, c := range chatAtOnce(p, n) {
				if c != 200 {
					errs++
				}
			}
			t.Logf("%d concurrent requests through the outage: %d client errors, %d retry overflows", n, errs, p.Stats().Get("upstream_rq_retry_overflow"))
			if tc.before {
				// Envoy's jittered retry back-off (0–25 ms, played since
				// #35) spreads the wave's retries a little: about half the
				// clients saw the 503 on an idle machine, and 12 of 240 on
				// a loaded one, whose slower wave overlaps less. How many is
				// the machine's; that the old limits overflow and fail
				// clients at all, where the shipped budget fails none, is
				// the finding.
				if errs == 0 || p.Stats().Get("upstream_rq_retry_overflow") == 0 {
					t.Fatalf("the old circuit breakers cost %d errors and %d retry overflows: the baseline no longer shows the finding",
						errs, p.Stats().Get("upstream_rq_retry_overflow"))
				}
				return
			}
			if errs != 0 {
				t.Fatalf("%d of %d clients saw an error while route 2 was healthy: %s", errs, n, failedEntries(p))
			}
			if got := w.providers["openai_us"].Served(); got == 0 {
				t.Fatalf("route 1 saw no attempt: the wave went elsewhere (message timeouts: %d)", p.Stats().Get("message_timeouts"))
			}
			eventually(t, "the breaker opens", func() bool {
				return w.breaker("failover", "openai:us-east:gpt-4o-mini")["state"] == "open"
			})
		})
	}
}

// chatStatus sends one chat request and returns its status (0: no answer).
// chatAtOnce sends n chat requests through p at the same moment and
// returns their statuses.
// failedEntries says what Envoy logged for every request that did not
// end 200, and how many message timeouts it counted: what a failed load
// test needs to be understood without a rerun.
func failedEntries(p *envoysim.Proxy) string {
	var out []string
	for _, e := range p.Log() {
		if e.Status != 200 || e.Reset {
			out = append(out, fmt.Sprintf("%d flags=%d details=%q route=%s cluster=%s attempts=%d reset=%v",
				e.Status, e.Flags, e.Details, e.Route, e.Cluster, e.Attempts, e.Reset))
		}
	}
	return fmt.Sprintf("message timeouts %d; entries: %s", p.Stats().Get("message_timeouts"), strings.Join(out, "; "))
}

func chatAtOnce(p *envoysim.Proxy, n int) []int {
	codes := make(chan int, n)
	var start sync.WaitGroup
	start.Add(1)
	for range n {
		go func() {
			start.Wait()
			codes <- chatStatus(p)
		}()
	}
	start.Done()
	out := make([]int, 0, n)
	for range n {
		out = append(out, <-codes)
	}
	return out
}

func chatStatus(p *envoysim.Proxy) int {
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(p.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// R-AL5 in the failover deployment: when the chain's first cluster is
// unknown to Envoy (NC) the router answers 503 before any upstream request:
// no attempt stream exists, and the access log entry has no upstream
// cluster. It is settled by its attempt count against its chain group:
// R-O12's log line and counter. Before, the entry waited in the note until
// it expired: three 503s with no log line and no counter.
func TestFailoverNoClusterIsReported(t *testing.T) {
	w := newFailoverWorld(t)
	cfg := w.failoverConfig()
	delete(cfg.Clusters, "openai_us")
	p := w.startProxy(cfg)
	for range 3 {
		if r := chat(t, p, gpt, false); r.status != 503 {
			t.Fatalf("%d from a chain whose first cluster Envoy lacks", r.status)
		}
	}
	eventually(t, "NC counted for its chain group", func() bool {
		return strings.Contains(w.scrape(), `aig_extproc_cluster_not_found_total{cluster="openai_us",gateway="failover"} 3`)
	})
	if !strings.Contains(w.logs.String(), "Envoy has no cluster for the route fusebox chose") {
		t.Fatal("no R-O12 log line")
	}
}

// #52: a retry to a cluster Envoy lacks is UH, not NC (router.cc doRetry;
// envoysim TestRetryToAMissingClusterIsNoHealthyUpstream). With the first
// provider refusing and the chain's second cluster missing, each request's
// retry gets the router's 503 UH. fusebox has never seen Envoy reach that
// cluster, so it judges the UH a configuration error: R-O12's log line and
// counter for the second cluster, and the second route is never charged.
// Before, each was a connection error on the second route.
func TestFailoverRetryToAMissingClusterIsAConfigError(t *testing.T) {
	w := newFailoverWorld(t)
	cfg := w.failoverConfig()
	delete(cfg.Clusters, "azure_eu")
	p := w.startProxy(cfg)
	w.providers["openai_us"].Down()
	for range 3 {
		if r := chat(t, p, gpt, false); r.status != 503 {
			t.Fatalf("%d from a chain whose second cluster Envoy lacks", r.status)
		}
	}
	eventually(t, "the retry's UH counted as a missing cluster", func() bool {
		return strings.Contains(w.scrape(), `aig_extproc_cluster_not_found_total{cluster="azure_eu",gateway="failover"} 3`)
	})
	m := w.scrape()
	if strings.Contains(m, `class="failure",gateway="failover",origin="local",reason="connection_error",route="azure:eu-west:gpt-4o-mini"`) {
		t.Fatal("the retry's UH was charged to the second route as a connection error")
	}
	if !strings.Contains(m, `aig_circuit_breaker_outcomes_total{class="failure",gateway="failover",origin="local",reason="connection_error",route="openai:us-east:gpt-4o-mini"} 3`) {
		t.Fatal("the refused first attempts were not connection errors")
	}
	if !strings.Contains(w.logs.String(), "read as a missing cluster") {
		t.Fatal("no log line says the UH was read as a missing cluster")
	}
}
