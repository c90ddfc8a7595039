package envoysim

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The failover facts of docs/envoy.md ("In-request failover"), each held
// to the proxy with a scripted processor playing both roles.

type foRig struct {
	*rig
	mu       sync.Mutex
	attempts []*extprocv3.ProcessingRequest // the attempt role's messages
	ups      map[string]*upstream
	// routeSets are more headers the route role sets with its decision.
	routeSets []*corev3.HeaderValueOption
}

// newFailoverRig: clusters c1..c3 answer per status (a status of 0 =
// 200 with a body); the route role chains groups; the attempt role runs
// attempt(req) (nil = plain).
func newFailoverRig(t *testing.T, status map[string]int, groups []string, numRetries int,
	attempt func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse, mods ...func(*Config)) *foRig {
	t.Helper()
	fr := &foRig{ups: map[string]*upstream{}}
	if attempt == nil {
		attempt = plain
	}
	byRole := func(role string, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if role == "attempt" {
			fr.mu.Lock()
			fr.attempts = append(fr.attempts, req)
			fr.mu.Unlock()
			return attempt(req)
		}
		if req.GetRequestHeaders() != nil {
			var gs []any
			for _, g := range groups {
				gs = append(gs, map[string]any{"name": g, "clusters": []any{map[string]any{"cluster_name": g, "weight": 1}}})
			}
			md, _ := structpb.NewStruct(map[string]any{"fusebox.failover": map[string]any{"priority_groups": gs}})
			resp := reqHeadersReply(&extprocv3.CommonResponse{
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: append([]*corev3.HeaderValueOption{set("x-fusebox-cluster", groups[0])}, fr.routeSets...)},
				ClearRouteCache: true,
			})
			resp.DynamicMetadata = md
			return resp
		}
		return plain(req)
	}
	fr.rig = newRig(t, plain, func(c *Config) {
		c.ExtProc.ReceivingNamespaces = []string{"fusebox", "fusebox.failover"}
		c.ExtProc.ResponseHeaderMode = 2 // SKIP: the attempt role judges
		for _, name := range []string{"c1", "c2", "c3"} {
			st := status[name]
			u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if st != 0 {
					w.WriteHeader(st)
					return
				}
				io.WriteString(w, "ok")
			})
			fr.ups[name] = u
			c.Clusters[name] = &Cluster{Addr: strings.TrimPrefix(u.srv.URL, "http://")}
		}
		c.Failover = &FailoverConfig{
			Namespace: "fusebox.failover", Groups: []string{"c1"},
			RetryOn: []string{"connect-failure", "reset", "retriable-status-codes"}, RetriableStatusCodes: []int{503},
			NumRetries: numRetries, IncludeAttemptCount: true,
			Attempt: ExtProcConfig{Addr: c.ExtProc.Addr, RequestHeaderMode: 1, ResponseHeaderMode: 1,
				RequestBodyMode: c.ExtProc.RequestBodyMode, ResponseBodyMode: c.ExtProc.ResponseBodyMode,
				MessageTimeout: c.ExtProc.MessageTimeout, InitialMetadata: map[string]string{"x-fusebox-role": "attempt"}},
			Remove: []string{"x-secret"},
		}
		for _, m := range mods {
			m(c)
		}
	})
	fr.proc.byRole = byRole
	return fr
}

func headerOf(req *extprocv3.ProcessingRequest, k string) string {
	for _, h := range req.GetRequestHeaders().GetHeaders().GetHeaders() {
		if h.Key == k {
			return string(h.RawValue)
		}
	}
	return ""
}

func clustersOf(a []AttemptLog) string {
	var out []string
	for _, x := range a {
		out = append(out, fmt.Sprintf("%s:%d", x.Cluster, x.Status))
	}
	return strings.Join(out, ",")
}

// priority_group: attempt k uses group min(k-1, groups-1), from fusebox's
// override; attempts are at most num_retries+1; x-envoy-attempt-count is
// 1..k on each attempt's request.
func TestFailoverGroupsPerAttempt(t *testing.T) {
	fr := newFailoverRig(t, map[string]int{"c1": 503, "c2": 503}, []string{"c1", "c2"}, 3, nil)
	resp, _ := fr.post(`{"a":1}`)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := clustersOf(fr.proxy.Attempts()); got != "c1:503,c2:503,c2:503,c2:503" {
		t.Fatalf("attempts %s", got)
	}
	var counts []string
	respHeaders := 0
	for _, r := range fr.attempts {
		if r.GetRequestHeaders() != nil {
			counts = append(counts, headerOf(r, "x-envoy-attempt-count"))
		}
		if r.GetResponseHeaders() != nil {
			respHeaders++
		}
	}
	// Each retried 503 went through the upstream filters before the
	// router decided to retry.
	if respHeaders != 4 {
		t.Fatalf("the attempt role saw %d response headers for 4 answered attempts", respHeaders)
	}
	if strings.Join(counts, ",") != "1,2,3,4" {
		t.Fatalf("attempt counts seen by the upstream filter: %v", counts)
	}
	if fr.ups["c2"].last.Header.Get("X-Envoy-Attempt-Count") != "4" {
		t.Fatalf("the upstream request carries attempt count %q", fr.ups["c2"].last.Header.Get("X-Envoy-Attempt-Count"))
	}
}

// The upstream filters of every attempt share the router's header map (an
// edit or a removal in attempt 1 is there in attempt 2), but each attempt
// gets a fresh copy of the router's body.
func TestFailoverSharedHeadersFreshBody(t *testing.T) {
	n := 0
	attempt := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		switch {
		case req.GetRequestHeaders() != nil:
			n++
			return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{set(fmt.Sprintf("x-edit-%d", n), "1")}}, ClearRouteCache: true})
		case req.GetRequestBody() != nil:
			return reqBodyReply(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(fmt.Sprintf(`{"attempt":%d}`, n))}}})
		}
		return plain(req)
	}
	fr := newFailoverRig(t, map[string]int{"c1": 503}, []string{"c1", "c2"}, 2, attempt)
	resp, _ := fr.post(`{"a":1}`, "X-Secret", "s")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var second *extprocv3.ProcessingRequest
	var bodies []string
	for _, r := range fr.attempts {
		if headerOf(r, "x-envoy-attempt-count") == "2" {
			second = r
		}
		if b := r.GetRequestBody(); b != nil {
			bodies = append(bodies, string(b.Body))
		}
	}
	if second == nil || headerOf(second, "x-edit-1") != "1" || headerOf(second, "x-secret") != "" {
		t.Fatalf("attempt 2's headers do not carry attempt 1's edit and removal: %v", second.GetRequestHeaders())
	}
	if len(bodies) != 2 || bodies[1] != `{"a":1}` {
		t.Fatalf("bodies seen per attempt %q: attempt 2 must get the router's body, not attempt 1's", bodies)
	}
	if fr.ups["c2"].body != `{"attempt":2}` || fr.ups["c2"].last.Header.Get("X-Edit-1") != "1" {
		t.Fatalf("c2 got body %q", fr.ups["c2"].body)
	}
	if fr.proxy.Stats().Get("clear_route_cache_upstream_ignored") != 2 {
		t.Fatalf("clear_route_cache from an upstream filter must be ignored (and counted): %v", fr.proxy.Stats().Get("clear_route_cache_upstream_ignored"))
	}
}

// An unknown cluster in the override fails the request with no_cluster
// (503, flag NC), no retry; an immediate response from the attempt role is
// a local reply that ends the request without a retry.
func TestFailoverNoClusterAndImmediate(t *testing.T) {
	fr := newFailoverRig(t, nil, []string{"nope", "c2"}, 2, nil)
	resp, _ := fr.post(`{"a":1}`)
	if resp.StatusCode != 503 || fr.proxy.Stats().Get("no_cluster") != 1 || fr.ups["c2"].hits != 0 {
		t.Fatalf("unknown cluster: %d, no_cluster %d, c2 hits %d", resp.StatusCode, fr.proxy.Stats().Get("no_cluster"), fr.ups["c2"].hits)
	}
	immediate := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
				Status: &typev3.HttpStatus{Code: 429}, Body: []byte("no")}}}
		}
		return plain(req)
	}
	fr = newFailoverRig(t, map[string]int{"c1": 503}, []string{"c1", "c2"}, 2, immediate)
	resp, _ = fr.post(`{"a":1}`)
	if resp.StatusCode != 429 || fr.ups["c1"].hits+fr.ups["c2"].hits != 0 {
		t.Fatalf("immediate response from the attempt role: %d, upstream hits %d", resp.StatusCode, fr.ups["c1"].hits+fr.ups["c2"].hits)
	}
}

// Once response headers went downstream nothing is retried: a body that
// breaks mid-flight reaches the client broken, after one attempt.
func TestFailoverNoRetryAfterHeaders(t *testing.T) {
	fr := newFailoverRig(t, nil, []string{"c1", "c2"}, 2, nil)
	fr.ups["c1"].srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	req, _ := http.NewRequest("POST", fr.proxy.URL()+"/v1/x", strings.NewReader(`{"a":1}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rerr == nil {
		t.Fatalf("status %d, read error %v: the client must see a broken stream", resp.StatusCode, rerr)
	}
	if got := clustersOf(fr.proxy.Attempts()); got != "c1:200" {
		t.Fatalf("attempts %s", got)
	}
}

// The router dials before the upstream filters run (acceptHeadersFromRouter
// calls the pool first): a refused connection resets attempt 1, and its
// ext_proc stream with it, while the attempt role still holds its headers
// reply; the body is never sent for it, and attempt 2 goes on. Before,
// envoysim ran the whole request phase first and dialled after it.
//
// Attempt 1's filter never answers its headers (its message timeout an
// hour): the request completes only if the refusal ended that stream.
// Before, a 300 ms reply and a bound on the request's time judged the
// machine as well.
func TestFailoverConnectFailureEndsTheAttemptStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	stuckFirst := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil && headerOf(req, "x-envoy-attempt-count") == "1" {
			<-release // the refusal comes first
		}
		return plain(req)
	}
	fr := newFailoverRig(t, nil, []string{"c1", "c2"}, 2, stuckFirst, func(c *Config) {
		c.ExtProc.MessageTimeout = time.Hour
		c.Failover.Attempt.MessageTimeout = time.Hour
	})
	fr.ups["c1"].srv.Close() // refused
	done := make(chan int, 1)
	go func() {
		resp, _ := fr.post(`{"a":1}`)
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		if code != 200 {
			t.Fatalf("status %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request waits for attempt 1's filter reply after its connection was refused")
	}
	if got := clustersOf(fr.proxy.Attempts()); got != "c1:0,c2:200" {
		t.Fatalf("attempts %s", got)
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var kinds []string
	for _, r := range fr.attempts {
		switch {
		case r.GetRequestHeaders() != nil:
			kinds = append(kinds, "headers:"+headerOf(r, "x-envoy-attempt-count"))
		case r.GetRequestBody() != nil:
			kinds = append(kinds, "body")
		case r.GetResponseHeaders() != nil:
			kinds = append(kinds, "response")
		}
	}
	// Attempt 1's headers message may or may not reach the processor
	// before its stream is cut (a message in flight when the stream is
	// reset is lost, in Envoy as here; under load it was, once in CI):
	// what is held is that attempt 1 sends nothing after its headers.
	var rest []string
	for _, k := range kinds {
		if k != "headers:1" {
			rest = append(rest, k)
		}
	}
	if got := strings.Join(rest, ","); len(kinds)-len(rest) > 1 || !strings.HasPrefix(got, "headers:2,body") || strings.Count(got, "body") != 1 {
		t.Fatalf("attempt-role messages %v: attempt 1 must be cut after its headers", kinds)
	}
}

// x-envoy-max-retries (retry_state_impl.cc): set by the route role with
// mutation_rules.allow_envoy it replaces num_retries for the request and
// never reaches an upstream; without allow_envoy the mutation is rejected
// and num_retries stands; a client's own is stripped by the connection
// manager.
func TestMaxRetriesHeader(t *testing.T) {
	cases := []struct {
		name       string
		allowEnvoy bool
		client     string // the client's own x-envoy-max-retries
		want       string
	}{
		{"route role, allow_envoy", true, "", "c1:503,c2:503"},
		{"route role, no allow_envoy", false, "", "c1:503,c2:503,c2:503,c2:503"},
		{"client only", true, "0", "c1:503,c2:503,c2:503,c2:503"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := newFailoverRig(t, map[string]int{"c1": 503, "c2": 503}, []string{"c1", "c2"}, 3, nil)
			fr.proxy.cfg.ExtProc.AllowEnvoy = tc.allowEnvoy
			var hdr []string
			if tc.client == "" {
				fr.routeSets = []*corev3.HeaderValueOption{set("x-envoy-max-retries", "1")}
			} else {
				hdr = []string{"x-envoy-max-retries", tc.client}
			}
			fr.post(`{"a":1}`, hdr...)
			if got := clustersOf(fr.proxy.Attempts()); got != tc.want {
				t.Fatalf("attempts %s, want %s", got, tc.want)
			}
			if v := fr.ups["c2"].last.Header.Get("X-Envoy-Max-Retries"); v != "" {
				t.Fatalf("x-envoy-max-retries reached the upstream: %q", v)
			}
		})
	}
}

// TestRetryResource: a retry is admitted only while the retry state's
// cluster (the first one the request was routed to) has a retry slot; an
// admitted retry holds it until the retried attempt ends, and a request
// refused a slot gets the failed attempt's answer (upstream_rq_retry_
// overflow). max_retries defaults to 3; a retry_budget replaces it with
// max(budget_percent × active requests, min_retry_concurrency).
func TestRetryResource(t *testing.T) {
	cases := []struct {
		name    string
		cluster Cluster
		retried int // of 4 concurrent requests whose retries stay open
	}{
		{"max_retries 0", Cluster{MaxRetries: NoRetries}, 0},
		{"max_retries 1", Cluster{MaxRetries: 1}, 1},
		{"max_retries default (3)", Cluster{}, 3},
		{"budget 20 %, min 1: the failing cluster has no requests left", Cluster{RetryBudget: &RetryBudget{Percent: 20, MinConcurrency: 1}}, 1},
		{"budget 100 %, min 10", Cluster{RetryBudget: &RetryBudget{Percent: 100, MinConcurrency: 10}}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := newFailoverRig(t, map[string]int{"c1": 503}, []string{"c1", "c2"}, 1, nil)
			c1 := fr.proxy.cfg.Clusters["c1"]
			c1.MaxRetries, c1.RetryBudget = tc.cluster.MaxRetries, tc.cluster.RetryBudget
			release := make(chan struct{})
			var mu sync.Mutex
			arrived := 0
			fr.ups["c2"].srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				arrived++
				mu.Unlock()
				<-release
				io.WriteString(w, "ok")
			})
			codes := make(chan int, 4)
			for range 4 {
				go func() {
					resp, _ := fr.post(`{"a":1}`)
					codes <- resp.StatusCode
				}()
			}
			// The refused ones answer at once; the retried ones wait on c2.
			refused := 0
			for refused < 4-tc.retried {
				if c := <-codes; c != 503 {
					t.Fatalf("a refused retry answered %d, want the failed attempt's 503", c)
				}
				refused++
			}
			waitFor(t, "the retried attempts reach c2", func() bool { mu.Lock(); defer mu.Unlock(); return arrived == tc.retried })
			close(release)
			for range tc.retried {
				if c := <-codes; c != 200 {
					t.Fatalf("a retried request answered %d", c)
				}
			}
			if got := fr.proxy.Stats().Get("upstream_rq_retry_overflow"); got != 4-tc.retried {
				t.Fatalf("overflow %d, want %d", got, 4-tc.retried)
			}
			// Every slot was given back.
			if n := fr.proxy.retryUse.of("c1").Load(); n != 0 {
				t.Fatalf("%d retry slots still held", n)
			}
		})
	}
}

// TestAttemptMetadataNeedsItsOwnNamespaces (docs/envoy.md, "In-request
// failover"): the attempt role's reply metadata reaches the request's
// dynamic metadata (the access log line) only through the attempt-role
// filter's own receiving namespaces, never the route role's: a filter with
// none keeps nothing. Before, envoysim applied the route role's list to
// attempt replies, which hid that envoy-failover.yaml's attempt filters had
// none.
func TestAttemptMetadataNeedsItsOwnNamespaces(t *testing.T) {
	outcome := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		r := plain(req)
		if req.GetResponseHeaders() != nil {
			md, _ := structpb.NewStruct(map[string]any{"fusebox": map[string]any{"outcome": "success"}})
			r.DynamicMetadata = md
		}
		return r
	}
	for _, ns := range [][]string{nil, {"fusebox"}} {
		t.Run(fmt.Sprint(ns), func(t *testing.T) {
			fr := newFailoverRig(t, map[string]int{}, []string{"c1"}, 1, outcome)
			fr.proxy.cfg.Failover.Attempt.ReceivingNamespaces = ns
			if resp, _ := fr.post(`{"a":1}`); resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			log := fr.proxy.Log()
			got := log[len(log)-1].Metadata["fusebox"].GetFields()["outcome"].GetStringValue()
			if want := map[bool]string{false: "", true: "success"}[ns != nil]; got != want {
				t.Fatalf("attempt filter namespaces %v: the entry's fusebox.outcome %q, want %q", ns, got, want)
			}
		})
	}
}

// per_try_timeout (router.cc onPerTryTimeoutCommon): an attempt whose
// response headers do not come in time is reset, its ext_proc stream with
// it, and retried as a reset (the policy retries on reset); the last one
// ends in a 504 UT, upstream_per_try_timeout. Before each attempt the
// router writes x-envoy-expected-rq-timeout-ms (setTimeoutHeaders), which
// the attempt role and the provider see, unless suppress_envoy_headers.
// Before, envoysim played no per-try timeout: a hung first route was never
// failed over.
func TestFailoverPerTryTimeout(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	cases := []struct {
		name     string
		groups   []string
		retries  int
		suppress bool
		status   int
		attempts string
		expected string
	}{
		{"failed over", []string{"c1", "c2"}, 2, false, 200, "c1:0,c2:200", "150"},
		{"the last attempt", []string{"c1"}, 0, false, 504, "c1:0", "150"},
		{"suppress_envoy_headers", []string{"c1", "c2"}, 2, true, 200, "c1:0,c2:200", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := newFailoverRig(t, nil, tc.groups, tc.retries, nil)
			slow := newUpstream(t, hang)
			fr.proxy.cfg.Clusters["c1"].Addr = strings.TrimPrefix(slow.srv.URL, "http://")
			fr.proxy.cfg.Failover.PerTryTimeout = 150 * time.Millisecond
			fr.proxy.cfg.Failover.SuppressEnvoyHeaders = tc.suppress
			resp, _ := fr.post(`{"a":1}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := clustersOf(fr.proxy.Attempts()); got != tc.attempts {
				t.Fatalf("attempts %s, want %s", got, tc.attempts)
			}
			if n := fr.proxy.Stats().Get("upstream_rq_per_try_timeout"); n != 1 {
				t.Fatalf("%d per-try timeouts", n)
			}
			if tc.status == 504 {
				log := fr.proxy.Log()
				if e := log[len(log)-1]; e.Flags&flagUT == 0 || e.Details != "upstream_per_try_timeout" {
					t.Fatalf("entry flags %#x details %q", e.Flags, e.Details)
				}
			}
			for _, r := range fr.attempts {
				if r.GetRequestHeaders() == nil {
					continue
				}
				if got := headerOf(r, "x-envoy-expected-rq-timeout-ms"); got != tc.expected {
					t.Fatalf("attempt %s: x-envoy-expected-rq-timeout-ms %q, want %q", headerOf(r, "x-envoy-attempt-count"), got, tc.expected)
				}
			}
		})
	}
}

// A chain group with no healthy host (a DNS outage, a self-hosted model
// scaled to zero) gets Envoy's own 503 UH: no upstream request, no attempt
// stream, no retry. On the first attempt the access log entry carries no
// attempt count (router.cc decodeHeaders answers before it sets one) and no
// upstream_cluster; on a later one (doRetry counted the retry first) it
// carries that attempt's number. Before, envoysim dialled an empty address,
// stamped attempt 1 and retried it as a connect failure.
func TestFailoverNoHealthyHost(t *testing.T) {
	for _, c := range []struct {
		name        string
		groups      []string
		wantAttempt uint32
		wantUps     string
	}{
		{"first attempt", []string{"c1", "c2"}, 0, ""},
		{"a retry", []string{"c3", "c1"}, 2, "c3:503"},
	} {
		t.Run(c.name, func(t *testing.T) {
			als, addr := startALS(t)
			fr := newFailoverRig(t, map[string]int{"c3": 503}, c.groups, 2, nil, func(cfg *Config) {
				cfg.Clusters["c1"].Addr = "" // no healthy host
				cfg.AccessLog = &AccessLogConfig{Addr: addr, LogName: "fusebox", Flags: []string{"UH"}}
			})
			resp, _ := fr.post(`{"a":1}`)
			if resp.StatusCode != 503 {
				t.Fatalf("status %d, want Envoy's 503", resp.StatusCode)
			}
			if got := clustersOf(fr.proxy.Attempts()); got != c.wantUps {
				t.Fatalf("upstream attempts %q, want %q", got, c.wantUps)
			}
			if fr.ups["c2"].hits != 0 {
				t.Fatal("a no-host reply was retried")
			}
			waitFor(t, "the UH entry", func() bool { return len(als.got()) == 1 })
			cp := als.got()[0].GetCommonProperties()
			if !cp.GetResponseFlags().GetNoHealthyUpstream() || cp.GetUpstreamCluster() != "" || cp.GetUpstreamRequestAttemptCount() != c.wantAttempt {
				t.Fatalf("entry: UH %v, cluster %q, attempt count %d (want %d)", cp.GetResponseFlags().GetNoHealthyUpstream(),
					cp.GetUpstreamCluster(), cp.GetUpstreamRequestAttemptCount(), c.wantAttempt)
			}
		})
	}
}

// TestFailoverFlags: the router flags a request's retries only where its
// retry state refused one (retry_state_impl.cc shouldRetry, router.cc):
// URX when the retries were spent and the last answer would have been
// retried, UO when the cluster's retry resource refused the retry, none
// when a retry succeeded. Before, envoysim set URX on every retried answer,
// successes included, and no UO on a refused retry.
func TestFailoverFlags(t *testing.T) {
	cases := []struct {
		name       string
		status     map[string]int
		numRetries int
		maxRetries int
		code       int
		flags      uint64
	}{
		{"a retry that succeeded", map[string]int{"c1": 503}, 1, 0, 200, 0},
		{"retries spent", map[string]int{"c1": 503, "c2": 503}, 1, 0, 503, flagURX},
		{"the retry resource refused the retry", map[string]int{"c1": 503}, 1, -1, 503, flagUO},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fr := newFailoverRig(t, tc.status, []string{"c1", "c2"}, tc.numRetries, nil)
			if tc.maxRetries < 0 {
				// A budget that admits no retry (0 % of none active, min 0).
				fr.proxy.cfg.Clusters["c1"].RetryBudget = &RetryBudget{}
			}
			resp, _ := fr.post(`{"a":1}`)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.code)
			}
			eventually(t, func() bool { return len(fr.proxy.Log()) == 1 })
			if e := fr.proxy.Log()[0]; e.Flags != tc.flags {
				t.Fatalf("entry flags %#x, want %#x", e.Flags, tc.flags)
			}
		})
	}
}

// TestRetrySlotFreedAtFinalHeaders: the retried attempt's response headers
// give its retry slot back (shouldRetryHeaders → resetRetry), so a
// streaming answer does not hold it while it flows.
func TestRetrySlotFreedAtFinalHeaders(t *testing.T) {
	fr := newFailoverRig(t, map[string]int{"c1": 503}, []string{"c1", "c2"}, 1, nil)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	fr.ups["c2"].srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		<-release // the answer keeps flowing
		io.WriteString(w, "ok")
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		fr.post(`{"a":1}`)
	}()
	seen := 0
	waitFor(t, "the retried attempt's headers", func() bool { seen += len(fr.proxy.Attempts()); return seen == 2 })
	waitFor(t, "the slot given back while the answer flows", func() bool { return fr.proxy.retryUse.of("c1").Load() == 0 })
	free()
	<-done
}

// TestFailoverStreamIdleTimeout: the connection manager's stream idle
// timer runs in the failover path too: a provider that never sends its
// headers gets the 504 SI (not retried: the connection manager ended the
// request), one that stalls after its headers has the stream reset with
// SI on the entry. Before, the failover path armed no idle timer.
func TestFailoverStreamIdleTimeout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		serve    http.HandlerFunc
		status   int
		reset    bool
		attempts int
	}{
		{"no headers", func(w http.ResponseWriter, r *http.Request) { stall(r) }, 504, false, 1},
		{"stalls after its headers", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			stall(r)
		}, 200, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fr := newFailoverRig(t, map[string]int{}, []string{"c1", "c2"}, 1, nil, func(c *Config) {
				c.StreamIdleTimeout = 250 * time.Millisecond
				c.RouteTimeout = 5 * time.Second
			})
			fr.ups["c1"].srv.Config.Handler = tc.serve
			resp, _ := fr.post(`{"a":1}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			eventually(t, func() bool { return len(fr.proxy.Log()) == 1 })
			e := fr.proxy.Log()[0]
			if e.Flags&flagSI == 0 || e.Reset != tc.reset || e.Attempts != tc.attempts {
				t.Fatalf("entry flags %#x reset %v attempts %d, want SI, %v, %d", e.Flags, e.Reset, e.Attempts, tc.reset, tc.attempts)
			}
		})
	}
}

// stall holds a provider's answer until its request ends, 3 s at most (a
// harness that never ends it must not hang the test's cleanup).
func stall(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-time.After(3 * time.Second):
	}
}

// TestFailoverRetryToAMissingCluster: a retry whose group names a cluster
// Envoy does not have gets doRetry's no-healthy-upstream reply (router.cc
// doRetry: getThreadLocalCluster finds none, sendNoHealthyUpstreamResponse),
// UH with the attempt counted, where the first attempt's missing cluster is
// decodeHeaders' NC. Before, envoysim answered NC on every attempt.
func TestFailoverRetryToAMissingCluster(t *testing.T) {
	fr := newFailoverRig(t, map[string]int{"c1": 503}, []string{"c1", "nope"}, 1, nil)
	resp, _ := fr.post(`{"a":1}`)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	eventually(t, func() bool { return len(fr.proxy.Log()) == 1 })
	e := fr.proxy.Log()[0]
	if e.Flags&flagUH == 0 || e.Flags&flagNC != 0 || e.Details != "no_healthy_upstream" || e.Attempts != 2 {
		t.Fatalf("entry flags %#x details %q attempts %d, want UH, no_healthy_upstream, 2", e.Flags, e.Details, e.Attempts)
	}
}

// TestAttemptRoleGetsItsCluster: the attempt role's request_attributes
// [xds.cluster_name] (envoy-failover.yaml) arrive with each attempt's
// request headers, naming that attempt's cluster. Before, envoysim sent
// request attributes to no filter.
func TestAttemptRoleGetsItsCluster(t *testing.T) {
	fr := newFailoverRig(t, map[string]int{"c1": 503}, []string{"c1", "c2"}, 1, nil, func(c *Config) {
		c.Failover.Attempt.RequestAttributes = []string{"xds.cluster_name"}
	})
	if resp, _ := fr.post(`{"a":1}`); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var got []string
	fr.mu.Lock()
	for _, r := range fr.attempts {
		if r.GetRequestHeaders() != nil {
			got = append(got, r.Attributes[attrKey].GetFields()["xds.cluster_name"].GetStringValue())
		}
	}
	fr.mu.Unlock()
	if strings.Join(got, ",") != "c1,c2" {
		t.Fatalf("xds.cluster_name per attempt: %v", got)
	}
}

// The attempt role is an upstream filter: it sees the response headers as
// the upstream sent them, before the router finalizes them
// (response_headers_to_add), and what it sets reaches the client with the
// router's own. Before, envoysim showed it the finalized headers, as to a
// downstream filter.
func TestAttemptRoleSeesTheUpstreamsHeaders(t *testing.T) {
	fr := newFailoverRig(t, nil, []string{"c1"}, 1, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		resp := plain(req)
		if req.GetResponseHeaders() != nil {
			resp.GetResponseHeaders().Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{set("x-from-attempt", "1")}}}
		}
		return resp
	}, func(c *Config) {
		c.ResponseHeadersToAdd = []HeaderToAdd{{Key: "x-vhost", Value: "added"}}
	})
	resp, _ := fr.post(`{"a":1}`)
	if resp.StatusCode != 200 || resp.Header.Get("x-vhost") != "added" || resp.Header.Get("x-from-attempt") != "1" {
		t.Fatalf("%d x-vhost %q x-from-attempt %q", resp.StatusCode, resp.Header.Get("x-vhost"), resp.Header.Get("x-from-attempt"))
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	seen := false
	for _, r := range fr.attempts {
		for _, h := range r.GetResponseHeaders().GetHeaders().GetHeaders() {
			seen = true
			if h.Key == "x-vhost" {
				t.Fatal("the attempt role saw the router's response_headers_to_add")
			}
		}
	}
	if !seen {
		t.Fatal("the attempt role saw no response headers")
	}
}
