package processor

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const faultConfig = `
policies:
  base: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 10000}
gateways:
  - id: default
    circuit_breaker: {policy: base}
    models:
      - {name: m, routes: ["openai:us:m", "azure:eu:m"]}
      - {name: sh, routes: ["openai:us:sh", "azure:eu:sh"], circuit_breaker: {mode: shadow}}
      - {name: nf, routes: ["openai:us:nf", "azure:eu:nf"], circuit_breaker: {request_fault_ttl_sec: 0}}
    routes:
      - {key: "openai:us:m", cluster: c1}
      - {key: "azure:eu:m", cluster: c2}
      - {key: "openai:us:sh", cluster: c3}
      - {key: "azure:eu:sh", cluster: c4}
      - {key: "openai:us:nf", cluster: c5}
      - {key: "azure:eu:nf", cluster: c6}
`

// send runs one request of model with body content through the route
// role, answered status; kv are further request headers.
func (e *env) sendBody(model, content, status string, kv ...string) {
	e.t.Helper()
	c := e.open("")
	r := c.reqHeaders(false, append([]string{"content-type", "application/json"}, kv...)...)
	if r.GetRequestHeaders() == nil {
		e.t.Fatalf("request headers: %v", r)
	}
	if d := c.reqBody(`{"model":"` + model + `","messages":[{"role":"user","content":"` + content + `"}]}`); d.GetImmediateResponse() != nil {
		e.t.Fatalf("no route: %v", d)
	}
	ok := strings.HasPrefix(status, "2")
	c.respHeaders(status, !ok, nil, "content-type", "application/json")
	if ok {
		c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	}
	c.end()
}

// TestRequestFaults (R-FD4): a request that fails again with the same
// answer, while its route answers others, counts for no route; its later
// failures neither, for request_fault_ttl_sec. Each rule at its edges.
func TestRequestFaults(t *testing.T) {
	type step struct {
		content, status string
		retry           int // x-stainless-retry-count
		advance         time.Duration
	}
	poisonRetried := []step{{"poison", "500", 0, 0}, {"poison", "500", 1, 0}, {"poison", "500", 2, 0}}
	cases := []struct {
		name     string
		model    string
		warm     int // successes of other requests first
		steps    []step
		state    string
		failures int // counted in the route's window
		faults   float64
		route    string
	}{
		{"an SDK retrying a poison request twice", "m", 5, poisonRetried, "closed", 1, 2, "openai:us:m"},
		{"identical bodies without a retry header are not one request", "m", 5,
			[]step{{"poison", "500", 0, 0}, {"poison", "500", 0, 0}}, "closed", 2, 0, "openai:us:m"},
		{"a remembered fault holds without a retry header", "m", 5,
			[]step{{"poison", "500", 0, 0}, {"poison", "500", 1, 0}, {"poison", "500", 0, 0}}, "closed", 1, 2, "openai:us:m"},
		{"an outage: every request fails, each retried once", "m", 5,
			[]step{{"a", "500", 0, 0}, {"a", "500", 1, 0}, {"b", "500", 0, 0}, {"b", "500", 1, 0}, {"c", "500", 0, 0}},
			"open", 3, 2, "openai:us:m"},
		{"a different answer is not the same request's", "m", 5,
			[]step{{"poison", "500", 0, 0}, {"poison", "503", 1, 0}}, "closed", 2, 0, "openai:us:m"},
		{"the guard: a route that answered nobody else", "m", 0, poisonRetried, "open", 3, 0, "openai:us:m"},
		{"the guard: a route failing more than it succeeds", "m", 2,
			[]step{{"a", "500", 0, 0}, {"b", "500", 0, 0}, {"poison", "500", 0, 0}, {"poison", "500", 1, 0}}, "open", 3, 0, "openai:us:m"},
		{"the fingerprint expires", "m", 5,
			[]step{{"poison", "500", 0, 0}, {"poison", "500", 1, 0}, {"poison", "500", 0, 601 * time.Second}}, "closed", 1, 1, "openai:us:m"},
		{"shadow: judged the same", "sh", 5, poisonRetried, "closed", 1, 2, "openai:us:sh"},
		{"request_fault_ttl_sec 0: not judged", "nf", 5, poisonRetried, "open", 3, 0, "openai:us:nf"},
	}
	for _, tc := range cases {
		for _, remote := range []bool{false, true} {
			name := tc.name
			if remote {
				name += " (remote store: judged aside)"
			}
			t.Run(name, func(t *testing.T) {
				e := newEnvConfig(t, faultConfig, func(o *Options) {
					if remote {
						o.Store = remoteStore{o.Store}
					}
				})
				for i := range tc.warm {
					e.sendBody(tc.model, "warm "+strconv.Itoa(i), "200")
				}
				for _, s := range tc.steps {
					e.clk.Advance(s.advance)
					e.sendBody(tc.model, s.content, s.status, "x-stainless-retry-count", strconv.Itoa(s.retry))
					e.srv.faults.busy.Wait() // a judging aside has recorded
				}
				st := e.status("default", tc.route)
				if st.State != tc.state {
					t.Errorf("state %s, want %s", st.State, tc.state)
				}
				if tc.state == "closed" && st.Failures != tc.failures {
					t.Errorf("failures counted %d, want %d", st.Failures, tc.failures)
				}
				if got := testutil.ToFloat64(e.metrics.RequestFaults.WithLabelValues("default", tc.model)); got != tc.faults {
					t.Errorf("fusebox_request_faults_total %v, want %v", got, tc.faults)
				}
				if tc.faults > 0 {
					series := e.metrics.Outcomes.WithLabelValues("default", tc.route, "neither", "request_fault", "")
					if got := testutil.ToFloat64(series); got != tc.faults {
						t.Errorf("neither/request_fault outcomes %v, want %v", got, tc.faults)
					}
				}
			})
		}
	}
}

// TestRequestFaultAcrossReplicas (R-FD4): the retry of a poison request
// lands on another replica of the fleet (one store): that replica reads
// the first one's note ahead, and the retry's failure counts for no
// route. Before the note, each replica judged alone and the retry counted.
func TestRequestFaultAcrossReplicas(t *testing.T) {
	a := newEnvConfig(t, faultConfig)
	b := newEnvConfig(t, faultConfig, func(o *Options) { o.Store = a.store; o.Clock = a.clk })
	for i := range 5 {
		a.sendBody("m", "warm a "+strconv.Itoa(i), "200")
		b.sendBody("m", "warm b "+strconv.Itoa(i), "200")
	}
	notes := a.store.NoteCount()
	a.sendBody("m", "poison", "500")
	deadline := time.Now().Add(10 * time.Second)
	for a.store.NoteCount() == notes && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.sendBody("m", "poison", "500", "x-stainless-retry-count", "1")
	for testutil.ToFloat64(b.metrics.RequestFaults.WithLabelValues("default", "m")) != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := testutil.ToFloat64(b.metrics.RequestFaults.WithLabelValues("default", "m")); got != 1 {
		t.Fatalf("replica b's request faults %v, want 1", got)
	}
	if st := a.status("default", "openai:us:m"); st.Failures != 1 {
		t.Fatalf("failures counted in the shared store %d, want 1 (the first only)", st.Failures)
	}
}

// remoteStore hides the memory store's InProcess: the processor treats
// it as a remote store, whose calls it keeps off the reply path.
type remoteStore struct{ breaker.Store }

// TestARepeatedBodyIsRecordedBeforeItsReply (R-FD4): a failure is
// recorded before its reply, as every outcome is, so that the client's
// next request meets the breaker it moved, unless its judging needs a
// remote store. Before, every failure of a fingerprint this replica knew
// was judged and recorded aside, after the reply, even one that can be no
// request fault (a request not sent again, whose fingerprint is known only
// as failed) and even on the memory store; e2e TestFailFastAndTryAll,
// which sends one body six times, found on a loaded CI machine a breaker
// that had not opened yet. Now on a remote store only a retry, or a
// fingerprint held as a fault, goes aside; on the memory store, none.
func TestARepeatedBodyIsRecordedBeforeItsReply(t *testing.T) {
	cases := []struct {
		name   string
		remote bool
		retry  []int // each request's x-stainless-retry-count (-1: none)
		held   int   // judgings left aside
		state  string
	}{
		{"remote: one body three times, no retry header", true, []int{-1, -1, -1}, 0, "open"},
		{"remote: a retry goes aside", true, []int{-1, 1}, 1, "closed"},
		{"memory: one body three times, no retry header", false, []int{-1, -1, -1}, 0, "open"},
		{"memory: a retry is judged before its reply", false, []int{-1, 1, 2}, 0, "open"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvConfig(t, faultConfig, func(o *Options) {
				if tc.remote {
					o.Store = remoteStore{o.Store}
				}
			})
			var mu sync.Mutex
			var held []func()
			e.srv.faults.aside = func(f func()) {
				mu.Lock()
				defer mu.Unlock()
				held = append(held, f)
			}
			for _, r := range tc.retry {
				var kv []string
				if r >= 0 {
					kv = []string{"x-stainless-retry-count", strconv.Itoa(r)}
				}
				e.sendBody("m", "same", "500", kv...)
			}
			mu.Lock()
			n := len(held)
			mu.Unlock()
			if n != tc.held {
				t.Errorf("%d judgings aside, want %d", n, tc.held)
			}
			if st := e.status("default", "openai:us:m"); st.State != tc.state || (st.State == "closed" && st.Failures != len(tc.retry)-n) {
				t.Errorf("before the reply: %s with %d failures, want %s with %d", st.State, st.Failures, tc.state, len(tc.retry)-n)
			}
			for _, f := range held {
				f()
			}
			if st := e.status("default", "openai:us:m"); st.State == "closed" && st.Failures != len(tc.retry) {
				t.Errorf("after the judging aside: %d failures, want %d", st.Failures, len(tc.retry))
			}
		})
	}
}

// TestTheLineSaysWhoseAndWhichRequest (R-FD5): the decision's metadata,
// which Envoy writes into the access log line, names the replica and, for
// a model that judges request faults, the request's keyed fingerprint and
// whether it was sent again: replay holds local failures for a quorum of
// replicas and judges request faults from them. Before, the line had
// neither, and replay counted every failure for its route.
func TestTheLineSaysWhoseAndWhichRequest(t *testing.T) {
	cases := []struct {
		name  string
		model string
		kv    []string
		fp    bool
		again bool
	}{
		{"a first try", "m", nil, true, false},
		{"an SDK's retry", "m", []string{"x-stainless-retry-count", "1"}, true, true},
		{"an idempotency key", "m", []string{"idempotency-key", "k-1"}, true, true},
		{"request faults off: no fingerprint", "nf", []string{"x-stainless-retry-count", "1"}, false, false},
	}
	e := newEnvConfig(t, faultConfig, func(o *Options) { o.Replica = "pod-a-1f2e" })
	fps := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := e.open("")
			c.reqHeaders(false, append([]string{"content-type", "application/json"}, tc.kv...)...)
			d := c.reqBody(`{"model":"` + tc.model + `","messages":[{"role":"user","content":"hi"}]}`)
			ns := d.GetDynamicMetadata().GetFields()["fusebox"].GetStructValue().GetFields()
			if got := ns["replica"].GetStringValue(); got != "pod-a-1f2e" {
				t.Errorf("replica %q", got)
			}
			fp := ns["fp"].GetStringValue()
			if _, ok := judge.ParseLogged(fp); ok != tc.fp {
				t.Errorf("fp %q, want one: %v", fp, tc.fp)
			}
			if got := ns["again"].GetBoolValue(); got != tc.again {
				t.Errorf("again %v, want %v", got, tc.again)
			}
			if fp != "" {
				fps[fp] = true
			}
			c.respHeaders("200", false, nil, "content-type", "application/json")
			c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
			c.end()
		})
	}
	// One body, read each time: one fingerprint, whatever the headers.
	if len(fps) != 1 {
		t.Errorf("%d fingerprints, want 1 (the body's): %v", len(fps), fps)
	}
}
