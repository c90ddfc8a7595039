package processor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// waitOutcomes waits for an asynchronous outcome (a retry's arrival is
// settled off the request path): polled, never a cooldown.
func (e *env) waitOutcomes(route, class, reason string, want float64) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.outcomes(route, class, reason) != want {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s %s/%s: %v, want %v", route, class, reason, e.outcomes(route, class, reason), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitNote waits until the decision of tok has a note (an arrival, run off
// the request path, has reached the store).
func (e *env) waitNote(tok string) {
	e.t.Helper()
	t, err := e.srv.parseAttemptToken(tok)
	if err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok, _ := e.store.SwapNote(context.Background(), lifecycle.NoteName(t.Decision), nil, nil, time.Second); !ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatal("no note")
		}
		time.Sleep(time.Millisecond)
	}
}

// replica is a second fusebox sharing e's store, config and clock: what
// two replicas behind one Envoy share through Redis.
func (e *env) replica() *env {
	e.t.Helper()
	r := newEnv(e.t, func(o *Options) { o.Store, o.Config, o.Clock = e.store, e.holder, e.clk })
	r.store, r.holder, r.clk = e.store, e.holder, e.clk
	return r
}

// R-X7: attempts of one request meet through the store whichever replica
// serves each: attempt 1 ends before headers on replica A, attempt 2
// reaches replica B, and the refused connection counts once, as a
// connection_error. On the code before the store carried the meeting, A
// parked it in its own memory and it became a neither after the park time.
func TestAttemptsMeetAcrossReplicas(t *testing.T) {
	a := newFailoverEnv(t)
	b := a.replica()
	tok := a.routeRole()
	c, _, _ := a.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end()
	c, _, _ = b.attempt(tok, "r-1", 2, "/v1/chat/completions")
	b.waitOutcomes("openai:us:gpt", "failure", "connection_error", 1)
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()
	if s := a.status("default", "openai:us:gpt"); s.WindowFailures != 1 {
		t.Fatalf("window failures %d, want 1", s.WindowFailures)
	}
	// A's park time ends: it must not record the attempt again.
	a.srv.meet.mu.Lock()
	var h *parkedHere
	for _, v := range a.srv.meet.here {
		h = v
	}
	a.srv.meet.mu.Unlock()
	if h != nil {
		h.timer.Stop()
		a.srv.meet.expire(h.st.decisionID, h)
	}
	if n := a.outcomes("openai:us:gpt", "neither", "client_cancel") + b.outcomes("openai:us:gpt", "neither", "client_cancel"); n != 0 {
		t.Fatalf("the attempt was recorded again as %v neither", n)
	}
	if s := a.status("default", "openai:us:gpt"); s.WindowFailures != 1 || s.WindowCalls != 1 {
		t.Fatalf("window %d failures of %d, want 1 of 1", s.WindowFailures, s.WindowCalls)
	}

	// The other order: attempt 2 reaches B before attempt 1's stream ends
	// on A.
	tok = a.routeRole()
	c2, _, _ := b.attempt(tok, "r-2", 2, "/v1/chat/completions")
	b.waitNote(tok)
	c, _, _ = a.attempt(tok, "r-2", 1, "/v1/chat/completions")
	c.end()
	a.waitOutcomes("openai:us:gpt", "failure", "connection_error", 1)
	c2.end()
}

// A client that sends the same x-request-id on two requests cannot turn
// one request's cancel into the other's connection error: the meeting is
// keyed by the decision id (R-X7).
func TestReusedRequestIDDoesNotJoinRequests(t *testing.T) {
	e := newFailoverEnv(t)
	t1, t2 := e.routeRole(), e.routeRole()
	c, _, _ := e.attempt(t1, "same", 1, "/v1/chat/completions")
	c.end() // request 1's client went away
	c, _, _ = e.attempt(t2, "same", 2, "/v1/chat/completions")
	c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
	c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
	c.end()
	e.waitNote(t2)
	if n := e.outcomes("openai:us:gpt", "failure", "connection_error"); n != 0 {
		t.Fatalf("another request's attempt counted %v connection errors", n)
	}
}

// countingStore counts the calls a shared store would make remotely.
type countingStore struct {
	breaker.Store
	status atomic.Int32
}

func (c *countingStore) Status(ctx context.Context, k breaker.Key, now int64) (breaker.Status, error) {
	c.status.Add(1)
	return c.Store.Status(ctx, k, now)
}

// An install (every config load, and every overlay change a fleet's feed
// reader applies) makes no store call per breaker: the state gauges come
// from the local state. Before, it asked the store for each breaker's
// status: N round trips inside the feed reader on Redis.
func TestInstallMakesNoCallPerBreaker(t *testing.T) {
	var cs *countingStore
	e := newEnv(t, func(o *Options) {
		cs = &countingStore{Store: o.Store}
		o.Store = cs
	})
	e.openRoute("default", "openai:us:gpt")
	rt, err := routes.Parse([]byte(testConfig), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.holder.Store(rt) // a reload: install again
	if n := cs.status.Load(); n != 0 {
		t.Fatalf("the installs asked the store for %d statuses", n)
	}
	if v := testutil.ToFloat64(e.metrics.State.WithLabelValues("default", "openai:us:gpt", "openai", "gateway")); v != 1 {
		t.Fatalf("the state gauge after the reload: %v, want 1 (open)", v)
	}
}
