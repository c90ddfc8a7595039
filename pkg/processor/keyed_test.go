package processor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// blipNotes is a store whose meeting place stops answering while down is
// set: a Redis paused by a fork or a failover, as every replica sees it.
// With lost set too, a swap that applies runs and its answer is lost.
type blipNotes struct {
	breaker.Store
	down *atomic.Bool
	lost *atomic.Bool
}

func (s blipNotes) SwapNote(ctx context.Context, name string, prev, next []byte, ttl time.Duration) ([]byte, bool, error) {
	if s.down.Load() {
		if s.lost != nil && s.lost.Load() {
			// The swap runs; a refused one answers as usual (the caller
			// tries again on the note it got), an applied one's answer is
			// lost.
			got, ok, err := s.Store.SwapNote(ctx, name, prev, next, ttl)
			if err != nil || !ok {
				return got, ok, err
			}
		}
		return nil, false, context.DeadlineExceeded
	}
	return s.Store.SwapNote(ctx, name, prev, next, ttl)
}

// #49, R-DL11: a park whose swap ran but whose answer was lost is in the
// note and on its replica's local copy at once. It is claimed from the note
// on one replica (the retry) and from the local copy on the other (an entry
// while the blip lasts there): one record. Before keyed records, two.
func TestALostParkAnswerCountsOnce(t *testing.T) {
	down, lost := new(atomic.Bool), new(atomic.Bool)
	a := newFailoverEnv(t, func(o *Options) { o.Store = blipNotes{Store: o.Store, down: down, lost: lost} })
	b := newFailoverEnv(t, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, a.clk })
	tok := a.routeRole()
	pt, err := a.srv.parseAttemptToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	route := pt.Chain[0].Route
	down.Store(true)
	lost.Store(true)
	c, _, _ := a.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end() // parks: the note takes it, the answer is lost
	eventually(t, "attempt 1 parked here too", func() bool { return a.srv.meet.len() == 1 })
	c2, _, _ := b.attempt(tok, "r-1", 2, "/v1/chat/completions")
	defer c2.end()
	b.waitOutcomes(route, "failure", "connection_error", 1)
	lost.Store(false)
	a.srv.onAccessLogEntry(connectFailureEntry(pt.Decision, route, 1))
	if s := a.status("default", route); s.Failures != 1 {
		t.Fatalf("one connect failure, claimed from the note and from the local copy: %d failures", s.Failures)
	}
}

// TestOneTimedOutRequestCountsOnceAcrossABlip (#49, R-DL11): observer
// profile. The route role decides and its stream ends early (1.37+); the
// decision parks in its note. The provider times out and Envoy answers 504,
// which the observer sees while the meeting place does not answer: its claim
// fails, so it records on its replica, and the note still says parked.
// Envoy's access log entry for the same request (504, UT) arrives after the
// blip, claims the parked decision and records it again. With threshold 2
// one request must not open the route. Before keyed records it did.
func TestOneTimedOutRequestCountsOnceAcrossABlip(t *testing.T) {
	down := new(atomic.Bool)
	e := newObserverEnv(t, func(o *Options) { o.Store = blipNotes{Store: o.Store, down: down} })
	al := e.accessLog()
	c := e.open("")
	d := c.chat("gpt")
	id := decisionOf(t, d)
	md := fuseboxMetadata(t, d)
	c.end() // the early close: the decision parks in its note
	eventually(t, "the decision parked", func() bool {
		p := e.srv.decisions.get(id)
		if p == nil {
			return false
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.w == lifecycle.WaitNote
	})
	down.Store(true)
	e.observeWith(md, []string{":status", "504", "content-type", "application/json"}, `{"error":{"message":"upstream request timeout"}}`)
	e.waitOutcomes("openai:us:gpt", "failure", "provider_5xx", 1)
	down.Store(false)
	al.send(logEntry{decision: id, cluster: "c_openai_us", code: 504, details: "upstream_response_timeout", flags: ut})
	eventually(t, "the entry taken", func() bool {
		return e.entries(EntryRecorded)+e.entries(EntryDuplicate) >= 1
	})
	if s := e.status("default", "openai:us:gpt"); s.State != "closed" || s.Failures != 1 {
		t.Fatalf("one request, observed and logged across a blip: %s with %d failures", s.State, s.Failures)
	}
}

// R-DL12 (#49): an attempt that parks while the meeting place does not
// answer writes its note once it answers again. Envoy's retry, arriving
// after the blip (here on another replica), then meets it: attempt 1 is a
// connection error. Before, the park waited on its replica alone and the
// retry never met it: a neither at the park's end.
func TestAParkMadeDuringABlipMeetsTheRetry(t *testing.T) {
	down := new(atomic.Bool)
	a := newFailoverEnv(t, func(o *Options) { o.Store = blipNotes{Store: o.Store, down: down} })
	b := newFailoverEnv(t, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, a.clk })
	tok := a.routeRole()
	down.Store(true)
	c, _, _ := a.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end() // refused: Envoy resets attempt 1 and retries it
	eventually(t, "attempt 1 parked here alone", func() bool { return a.srv.meet.len() == 1 })
	down.Store(false)
	a.clk.Advance(lifecycle.ResendEvery)
	eventually(t, "the park written to the note", func() bool {
		got, _, _ := a.store.SwapNote(context.Background(), lifecycle.NoteName(decisionOfToken(t, a, tok)), nil, nil, time.Second)
		return got != nil
	})
	c2, _, _ := b.attempt(tok, "r-1", 2, "/v1/chat/completions")
	defer c2.end()
	eventually(t, "attempt 1 recorded as a connection error", func() bool {
		return a.outcomes("openai:us:gpt", "failure", "connection_error")+b.outcomes("openai:us:gpt", "failure", "connection_error") == 1
	})
	a.clk.Advance(lifecycle.ParkFor)
	if n := a.outcomes("openai:us:gpt", "neither", "no_outcome"); n != 0 {
		t.Fatal("attempt 1 also became a neither")
	}
}

func decisionOfToken(t *testing.T, e *env, tok string) string {
	t.Helper()
	pt, err := e.srv.parseAttemptToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	return pt.Decision
}

// R-DL12 (#49): a route-role decision that could not park (the meeting
// place did not answer) writes its note once it answers again. Envoy's
// access log entry, reaching another replica after the blip, then meets
// it and the connect failure is recorded. Before, the decision waited on
// its replica alone, the entry waited in a note nobody read, and the
// failure became a neither at the wait's end.
func TestADecisionParkedDuringABlipMeetsTheEntry(t *testing.T) {
	down := new(atomic.Bool)
	a := newEnv(t, func(o *Options) { o.Store = blipNotes{Store: o.Store, down: down} })
	b := newEnv(t, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, a.clk })
	c := a.open("")
	id := decisionOf(t, c.chat("gpt"))
	down.Store(true)
	c.end() // Envoy's own local reply: the route role saw no response
	eventually(t, "the decision waits here alone", func() bool {
		p := a.srv.decisions.get(id)
		if p == nil {
			return false
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.w == lifecycle.WaitAlone
	})
	down.Store(false)
	a.clk.Advance(lifecycle.ResendEvery)
	eventually(t, "the park written to the note", func() bool {
		got, _, _ := a.store.SwapNote(context.Background(), lifecycle.NoteName(id), nil, nil, time.Second)
		return got != nil
	})
	bl := b.accessLog()
	bl.send(logEntry{decision: id, cluster: "c_openai_us", code: 503, details: "upstream_reset_before_response_started{connection_failure}", flags: uf})
	eventually(t, "the connect failure recorded", func() bool {
		return a.outcomes("openai:us:gpt", "failure", "connection_error")+b.outcomes("openai:us:gpt", "failure", "connection_error") == 1
	})
	a.clk.Advance(time.Minute)
	if n := a.outcomes("openai:us:gpt", "neither", "no_outcome"); n != 0 {
		t.Fatal("the decision also became a neither")
	}
}

// connectFailureEntry is Envoy's access log entry for attempt n of
// decision, refused on route's cluster (the failover env's clusters).
func connectFailureEntry(decision, route string, n uint32) *accesslogdatav3.HTTPAccessLogEntry {
	cluster := map[string]string{"openai:us:gpt": "c_openai_us", "azure:eu:gpt": "c_azure_eu", "openai:eu:gpt": "c_openai_eu"}[route]
	return logEntry{decision: decision, cluster: cluster, code: 503, attempt: n,
		details: "upstream_reset_before_response_started{connection_failure}", flags: uf}.proto()
}
