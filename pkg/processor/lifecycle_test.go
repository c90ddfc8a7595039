package processor

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// The findings of #34, each as the operator met it.

func (e *env) decisionEvents(event, result string) float64 {
	return testutil.ToFloat64(e.metrics.DecisionEvents.WithLabelValues(event, result))
}

// observedDecision runs the route role of the observer profile and ends
// its stream after the request phase (Envoy 1.37+ closes it there, R-DL3);
// it returns what Envoy forwards to the observer.
func (e *env) observedDecision(model string) *corev3.Metadata {
	e.t.Helper()
	c := e.open("")
	d := c.chat(model)
	c.end()
	return fuseboxMetadata(e.t, d)
}

// R-DL3: in the observer profile an answer that begins long after the
// route role's stream closed (a slow provider; the stream closes right
// after the request phase on Envoy 1.37+) is still recorded: the decision
// waits decision_wait_sec, not access_log.wait_ms. Before, two 503s
// observed 2.5 s after their decisions left a threshold-2 route closed (the
// 2 s wait made them neithers); the wait was a real timer, so this test,
// on the injected clock, shows it only with the clock's timers (the old
// code's wait did not run on it).
func TestObserverRecordsASlowAnswer(t *testing.T) {
	for _, late := range []time.Duration{2500 * time.Millisecond, 290 * time.Second} {
		t.Run(late.String(), func(t *testing.T) {
			e := newObserverEnv(t)
			a, b := e.observedDecision("gpt"), e.observedDecision("gpt")
			e.clk.Advance(late)
			if e.srv.decisions.len() != 2 {
				t.Fatalf("%d decisions wait after %s, want 2", e.srv.decisions.len(), late)
			}
			e.observe(a, "503", `{"error":{}}`)
			e.observe(b, "503", `{"error":{}}`)
			eventually(t, "two slow 503s open the route", func() bool { return e.status("default", "openai:us:gpt").State == "open" })
			if n := e.outcomes("openai:us:gpt", "neither", "no_outcome"); n != 0 {
				t.Fatalf("%v neithers", n)
			}
		})
	}
}

// A decision the observer never sees (a local reply on Envoy 1.34–1.36) is
// a neither once decision_wait_sec has passed on the injected clock, and
// it frees its slot. Before, TestObserverNeverCameIsANeither passed with no
// neither ever recorded (the wait was a real timer the fake clock never
// reached).
func TestObserverNeverCameEndsAfterTheWait(t *testing.T) {
	e := newObserverEnv(t)
	e.observedDecision("gpt")
	e.clk.Advance(299 * time.Second)
	if n := e.outcomes("openai:us:gpt", "neither", "no_outcome"); n != 0 {
		t.Fatal("ended before decision_wait_sec")
	}
	e.clk.Advance(2 * time.Second)
	eventually(t, "a neither after decision_wait_sec", func() bool { return e.outcomes("openai:us:gpt", "neither", "no_outcome") == 1 })
	if e.srv.decisions.len() != 0 {
		t.Fatal("still kept")
	}
}

// R-DL4: one observer record per decision. Before, one decision's 503
// observed six times opened a threshold-3 route.
func TestReplayedObserverNoteRecordsOnce(t *testing.T) {
	e := newObserverEnv(t)
	md := e.observedDecision("gpt")
	for range 6 {
		e.observe(md, "503", `{"error":{}}`)
	}
	eventually(t, "the 503 is recorded", func() bool { return e.status("default", "openai:us:gpt").Failures == 1 })
	eventually(t, "the replays are counted", func() bool { return e.decisionEvents("observe", "duplicate") == 5 })
	if s := e.status("default", "openai:us:gpt"); s.Failures != 1 || s.State != "closed" {
		t.Fatalf("%+v", s)
	}
}

// R-DL4: a note that was not sealed by this fleet records nothing, and an
// observer stream where the config deploys none records nothing either
// (R-DL10: counted as a mismatch). Before, five forged 503s opened a
// route, with envoy.observer off too, and a forged 200 closed a half-open
// breaker without a probe.
func TestForgedObserverNoteRecordsNothing(t *testing.T) {
	forged := func(e *env) *corev3.Metadata {
		n := observeNote{Decision: lifecycle.NewDecisionID(), Parked: lifecycle.Park{Gateway: "default", Route: "openai:us:gpt", Cluster: "c_openai_us", RouteGen: 1, Start: e.clk.Now().UnixNano()}}
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{observeNS: {Fields: map[string]*structpb.Value{
			observeKey: structpb.NewStringValue(n.Encode())}}}}
	}
	t.Run("forged", func(t *testing.T) {
		e := newObserverEnv(t)
		for range 5 {
			e.observe(forged(e), "503", `{"error":{}}`)
		}
		eventually(t, "the forgeries are counted", func() bool { return e.decisionEvents("observe", "forged") == 5 })
		if s := e.status("default", "openai:us:gpt"); s.Failures != 0 {
			t.Fatalf("forged notes recorded: %+v", s)
		}
	})
	t.Run("another fleet's key", func(t *testing.T) {
		other := newEnvConfig(t, "envoy: {observer: true}\n"+testConfig, func(o *Options) { o.TokenKey = []byte("another fleet") })
		md := other.observedDecision("gpt")
		e := newObserverEnv(t)
		e.observe(md, "503", `{"error":{}}`)
		eventually(t, "counted as forged", func() bool { return e.decisionEvents("observe", "forged") == 1 })
	})
	t.Run("observer not deployed", func(t *testing.T) {
		e := newEnv(t) // envoy.observer false
		obs := newObserverEnv(t, func(o *Options) { o.Store, o.Clock, o.TokenKey = e.store, e.clk, []byte("the test fleet key") })
		md := obs.observedDecision("gpt")
		for range 3 {
			e.observe(md, "503", `{"error":{}}`)
		}
		if v := testutil.ToFloat64(e.metrics.DeploymentMismatch.WithLabelValues(MismatchObserver)); v != 3 {
			t.Fatalf("mismatch counted %v, want 3", v)
		}
		if s := e.status("default", "openai:us:gpt"); s.Failures != 0 {
			t.Fatalf("an observer the config does not deploy recorded: %+v", s)
		}
	})
}

// R-DL10: an attempt-role stream where the config deploys no failover is
// counted and named.
func TestDeploymentMismatchIsCounted(t *testing.T) {
	e := newEnv(t)
	var heard []string
	e.srv.onMismatch = func(what, _ string) { heard = append(heard, what) }
	c := e.open("attempt")
	c.reqHeaders(true)
	c.end()
	if v := testutil.ToFloat64(e.metrics.DeploymentMismatch.WithLabelValues(MismatchAttempt)); v != 1 {
		t.Fatalf("counted %v", v)
	}
	if len(heard) != 1 || heard[0] != MismatchAttempt {
		t.Fatalf("heard %v", heard)
	}
	f := newFailoverEnv(t)
	c = f.open("route")
	c.chat("fo")
	c.respHeaders("200", true, attrs(0, "via_upstream"))
	c.end()
	if v := testutil.ToFloat64(f.metrics.DeploymentMismatch.WithLabelValues(MismatchResponseInFail)); v != 1 {
		t.Fatalf("response phases in failover counted %v", v)
	}
}

// R-DL6: the observer on another replica times from its own first message
// plus the request phase, never the route role's start against its own
// clock. Before, with 1.5 s of skew, instant answers counted as slow and
// the route opened on slow_call_rate.
func TestObserverLatencyOnOneClock(t *testing.T) {
	a := newObserverEnv(t)
	skewed := breaker.NewFakeClock(a.clk.Now().Add(1500 * time.Millisecond))
	b := newObserverEnv(t, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, skewed })
	for range 4 {
		md := a.observedDecision("slowm")
		b.observe(md, "200", `{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`)
	}
	eventually(t, "four successes", func() bool { return b.outcomes("openai:us:slow", "success", "success") == 4 })
	if s := a.status("default", "openai:us:slow"); s.State != "closed" {
		t.Fatalf("instant answers opened the route on another replica's clock: %+v", s)
	}
}

// R-DL2: a real outcome beats an expiry. The wait ended (a neither freed
// the slot), then the observer's answer comes: it is recorded, late, once.
func TestLateObserverAfterTheWaitRecordsOnce(t *testing.T) {
	rt, err := routes.Parse([]byte("decision_wait_sec: 5\nenvoy: {observer: true}\n"+testConfig), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := newObserverEnv(t)
	e.holder.Store(rt)
	md := e.observedDecision("gpt")
	e.clk.Advance(6 * time.Second)
	eventually(t, "the wait ends", func() bool { return e.outcomes("openai:us:gpt", "neither", "no_outcome") == 1 })
	e.observe(md, "503", `{"error":{}}`)
	e.observe(md, "503", `{"error":{}}`)
	eventually(t, "the late answer is recorded", func() bool { return e.status("default", "openai:us:gpt").Failures == 1 })
	eventually(t, "counted late, then duplicate", func() bool {
		return e.decisionEvents("observe", "late") == 1 && e.decisionEvents("observe", "duplicate") == 1
	})
}

// chainEntry is an NC or UH entry of a failover decision: no host was
// picked, so no upstream_cluster; the fusebox namespace carries the
// decision's metadata as the route role wrote it: the chain and gateway in
// plain words, and the sealed token (tok; "" for none).
func chainEntry(decision, chain, tok string, attempt uint32, flags *accesslogdatav3.ResponseFlags) *accesslogdatav3.HTTPAccessLogEntry {
	p := logEntry{decision: decision, code: 503, flags: flags, attempt: attempt}.proto()
	ns := p.CommonProperties.Metadata.FilterMetadata["fusebox"].Fields
	ns["chain"] = structpb.NewStringValue(chain)
	ns["gateway"] = structpb.NewStringValue("default")
	if tok != "" {
		ns[tokenKey] = structpb.NewStringValue(tok)
	}
	return p
}

// R-AL5: NC and UH settle by attempt count. With chain a,b and attempt 1
// parked, an UH entry for attempt 2 charges b (no attempt stream exists for
// it) and attempt 1 was retried: a connection error. An NC on attempt 1
// with nothing parked is logged and counted (R-O12). Before, attempt 1
// became a neither, b was never charged, and NC left no log line or
// counter.
func TestNoHostEntriesSettleByAttempt(t *testing.T) {
	e := newFailoverEnv(t)
	tok := e.routeRole()
	pt, _ := e.srv.parseAttemptToken(tok)
	chain := pt.Chain[0].Route + "," + pt.Chain[1].Route
	c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end()
	eventually(t, "attempt 1 parked", func() bool { return e.srv.meet.len() == 1 })
	uh := &accesslogdatav3.ResponseFlags{NoHealthyUpstream: true}
	// Envoy has reached b's cluster before: its UH is no healthy host.
	e.srv.onAccessLogEntry(logEntry{decision: lifecycle.NewDecisionID(), cluster: "c_azure_eu", code: 200}.proto())
	e.srv.onAccessLogEntry(chainEntry(pt.Decision, chain, tok, 2, uh))
	e.waitOutcomes(pt.Chain[0].Route, "failure", "connection_error", 1)
	e.waitOutcomes(pt.Chain[1].Route, "failure", "connection_error", 1)
	e.clk.Advance(lifecycle.ParkFor)
	if n := e.outcomes(pt.Chain[0].Route, "neither", "no_outcome"); n != 0 {
		t.Fatal("attempt 1 also became a neither")
	}

	tok = e.routeRole()
	pt, _ = e.srv.parseAttemptToken(tok)
	e.srv.onAccessLogEntry(chainEntry(pt.Decision, chain, tok, 1, nc))
	if v := testutil.ToFloat64(e.metrics.ClusterNotFound.WithLabelValues("default", "c_openai_us")); v != 1 {
		t.Fatalf("NC counted %v", v)
	}
}

// #52: a retry to a cluster Envoy does not have is UH, not NC (router.cc
// doRetry), indistinguishable in the entry from a cluster with no healthy
// host. A retry's UH to a cluster no entry has named is a configuration
// error (R-O12): a neither, logged and counted in cluster_not_found, and
// the route stays closed however many come. Once an entry has named the
// cluster, the same UH is a connection error. A first attempt's UH is a
// connection error either way (its missing cluster would be NC). Before,
// every retry's UH was a connection error and opened the route.
func TestRetryNoHostToAnUnreachedClusterIsAConfigError(t *testing.T) {
	e := newFailoverEnv(t)
	uh := &accesslogdatav3.ResponseFlags{NoHealthyUpstream: true}
	var second string
	for range 3 {
		tok := e.routeRole()
		pt, _ := e.srv.parseAttemptToken(tok)
		second = pt.Chain[1].Route
		e.srv.onAccessLogEntry(chainEntry(pt.Decision, pt.Chain[0].Route+","+second, tok, 2, uh))
	}
	e.waitOutcomes(second, "neither", "cluster_not_found", 3)
	if s := e.status("default", second); s.State != "closed" || s.Failures != 0 {
		t.Fatalf("three retries' UH to a cluster Envoy never reached: %s with %d failures", s.State, s.Failures)
	}
	if v := testutil.ToFloat64(e.metrics.ClusterNotFound.WithLabelValues("default", "c_azure_eu")); v != 3 {
		t.Fatalf("cluster_not_found counted %v, want 3", v)
	}
	e.srv.onAccessLogEntry(logEntry{decision: lifecycle.NewDecisionID(), cluster: "c_azure_eu", code: 200}.proto())
	for range 2 {
		tok := e.routeRole()
		pt, _ := e.srv.parseAttemptToken(tok)
		e.srv.onAccessLogEntry(chainEntry(pt.Decision, pt.Chain[0].Route+","+second, tok, 2, uh))
	}
	e.waitOutcomes(second, "failure", "connection_error", 2)
	// A first attempt's UH to a cluster never reached: a connection error.
	tok := e.routeRole()
	pt, _ := e.srv.parseAttemptToken(tok)
	e.srv.onAccessLogEntry(chainEntry(pt.Decision, pt.Chain[0].Route+","+second, tok, 0, uh))
	e.waitOutcomes(pt.Chain[0].Route, "failure", "connection_error", 1)
}

// A flood of entries for unknown decisions never evicts a real decision's
// evidence (R-DL5): the genuine connect failure that follows is recorded.
func TestEntryFloodKeepsRealEvidence(t *testing.T) {
	e := newEnv(t)
	for range 140000 { // 2–4 s of sending from a client that reaches the port
		e.srv.onAccessLogEntry(logEntry{decision: lifecycle.NewDecisionID(), cluster: "c_openai_us", code: 503, flags: uf}.proto())
	}
	for range 2 {
		c := e.open("")
		id := decisionOf(t, c.chat("gpt"))
		c.end()
		e.srv.onAccessLogEntry(logEntry{decision: id, cluster: "c_openai_us", code: 503, flags: uf}.proto())
	}
	eventually(t, "the real failures are recorded", func() bool { return e.outcomes("openai:us:gpt", "failure", "connection_error") == 2 })
	if s := e.status("default", "openai:us:gpt"); s.State != "open" {
		t.Fatalf("two genuine connect failures after a flood: %+v", s)
	}
	if n := e.store.NoteCount(); n > lifecycle.MaxEarly+10 {
		t.Fatalf("the flood made %d notes", n)
	}
}

// The same flood in the failover deployment: an attempt that ends before
// headers still parks, and its retry still makes it a connection error.
// Before, the flood filled the note table and 4 of 4 genuine connect
// failures were neithers.
func TestEntryFloodKeepsParkedAttempts(t *testing.T) {
	e := newFailoverEnv(t)
	for range 140000 {
		e.srv.onAccessLogEntry(logEntry{decision: lifecycle.NewDecisionID(), cluster: "c_openai_us", code: 503, flags: uf}.proto())
	}
	tok := e.routeRole()
	c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end()
	eventually(t, "attempt 1 parked", func() bool { return e.srv.meet.len() == 1 })
	c, _, _ = e.attempt(tok, "r-1", 2, "/v1/chat/completions")
	e.waitOutcomes("openai:us:gpt", "failure", "connection_error", 1)
	c.end()
	if v := e.decisionEvents("entry", "dropped"); v != 140000-lifecycle.MaxEarly {
		t.Fatalf("dropped %v", v)
	}
}

// R-DL4: a sealed attempt token replayed (the same attempt number again,
// from whoever reaches the ext_proc port with a token a provider saw)
// records nothing. Before, one token recorded 10 failures.
func TestReplayedAttemptTokenRecordsOnce(t *testing.T) {
	e := newFailoverEnv(t)
	tok := e.routeRole()
	for range 10 {
		c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
		c.respHeaders("503", true, attrs(0, "via_upstream"))
		c.end()
	}
	eventually(t, "the replays are counted", func() bool { return e.decisionEvents("arrive", "duplicate") == 9 })
	if n := e.outcomes("openai:us:gpt", "failure", "provider_5xx"); n != 1 {
		t.Fatalf("one token recorded %v failures", n)
	}
}

// A decision waiting on its replica that the observer claimed on another
// replica is settled: an entry that reaches the deciding replica then
// records nothing (one record per decision).
func TestWaitingDecisionClaimedElsewhereRecordsOnce(t *testing.T) {
	a := newObserverEnv(t)
	b := newObserverEnv(t, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, a.clk })
	c := a.open("")
	d := c.chat("gpt")
	id := decisionOf(t, d)
	c.end()
	eventually(t, "parked", func() bool {
		p := a.srv.decisions.get(id)
		if p == nil {
			return false
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.w == lifecycle.WaitNote || p.w == lifecycle.WaitAlone
	})
	b.observe(fuseboxMetadata(t, d), "503", `{"error":{}}`)
	eventually(t, "the observer records", func() bool { return a.status("default", "openai:us:gpt").Failures == 1 })
	a.srv.onAccessLogEntry(logEntry{decision: id, cluster: "c_openai_us", code: 503, flags: uf}.proto())
	if s := a.status("default", "openai:us:gpt"); s.Failures != 1 {
		t.Fatalf("recorded again on the deciding replica: %+v", s)
	}
	if a.entries(EntryDuplicate) != 1 {
		t.Fatalf("the entry was not counted a duplicate")
	}
}

// A sealed observe note older than any decision still waits is a replay:
// refused and counted, even where its note is gone from the store.
func TestOldObserveNoteIsRefused(t *testing.T) {
	e := newObserverEnv(t)
	old := observeNote{Decision: lifecycle.NewDecisionID(), Parked: lifecycle.Park{Gateway: "default", Route: "openai:us:gpt", Cluster: "c_openai_us",
		RouteGen: 1, Start: e.clk.Now().Add(-400 * time.Second).UnixNano()}}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{observeNS: {Fields: map[string]*structpb.Value{
		observeKey: structpb.NewStringValue(e.srv.tokens.SealFor(lifecycle.ObserveAAD, []byte(old.Encode())))}}}}
	e.observe(md, "503", `{"error":{}}`)
	eventually(t, "refused", func() bool { return e.decisionEvents("observe", "duplicate") == 1 })
	if s := e.status("default", "openai:us:gpt"); s.Failures != 0 {
		t.Fatalf("an old note recorded: %+v", s)
	}
}

// TestFloodFigures prints (FUSEBOX_FIGURES=1) what the flood of #34 costs:
// 140,000 entries for random decision ids, the notes they leave and the
// live heap after a collection, against the heap before the flood (same
// run). The bound itself is asserted: at most lifecycle.MaxEarly notes.
func TestFloodFigures(t *testing.T) {
	e := newEnv(t)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for range 140000 {
		e.srv.onAccessLogEntry(logEntry{decision: lifecycle.NewDecisionID(), cluster: "c_openai_us", code: 503, flags: uf}.proto())
	}
	after := heap()
	if n := e.store.NoteCount(); n > lifecycle.MaxEarly {
		t.Fatalf("%d notes after the flood, bound %d", n, lifecycle.MaxEarly)
	}
	if os.Getenv("FUSEBOX_FIGURES") != "" {
		t.Logf("flood_figures: 140000 entries: %d notes kept (bound %d), %d dropped; live heap %.1f MiB -> %.1f MiB",
			e.store.NoteCount(), lifecycle.MaxEarly, int(e.decisionEvents("entry", "dropped")), float64(before)/(1<<20), float64(after)/(1<<20))
	}
}

// slowNotes delays every note swap: the meeting place answers after the
// attempt's response was judged.
type slowNotes struct {
	breaker.Store
	delay time.Duration
}

func (s slowNotes) SwapNote(ctx context.Context, name string, prev, next []byte, ttl time.Duration) ([]byte, bool, error) {
	time.Sleep(s.delay)
	return s.Store.SwapNote(ctx, name, prev, next, ttl)
}

// An attempt whose response is judged before the note answered its
// arrival is recorded once the note answers (off the reply path).
func TestAttemptRecordedAfterASlowArrival(t *testing.T) {
	e := newFailoverEnv(t, func(o *Options) { o.Store = slowNotes{Store: o.Store, delay: 200 * time.Millisecond} })
	tok := e.routeRole()
	c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.respHeaders("503", true, attrs(0, "via_upstream"))
	c.end()
	e.waitOutcomes("openai:us:gpt", "failure", "provider_5xx", 1)
}
