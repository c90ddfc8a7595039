package processor

import (
	"sync/atomic"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// R-DL12, R-DL13 (#49, found by lifecycle.TestTwoReplicasStoreAnswers): an
// entry that claims a parked attempt in its note, on another replica,
// while the store runs the claim and loses its answer. Before, the entry
// was read as not applied and dropped (unknown_decision), the note no
// longer held the attempt, and the connect failure was recorded nowhere.
// Now the entry is sent again with its id and the note gives it the claim
// it made.
func TestALostClaimAnswerIsRecordedWhenSentAgain(t *testing.T) {
	down, lost := new(atomic.Bool), new(atomic.Bool)
	a := newFailoverEnv(t)
	// Only B's calls lose their answers: A holds the attempt and cannot
	// settle it on its own.
	b := newFailoverEnv(t, func(o *Options) {
		o.Store, o.Config, o.Clock = blipNotes{Store: a.store, down: down, lost: lost}, a.holder, a.clk
	})
	tok := a.routeRole()
	pt, err := a.srv.parseAttemptToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	route := pt.Chain[0].Route
	c, _, _ := a.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end() // parks in its note on A
	eventually(t, "attempt 1 parked", func() bool { return a.srv.meet.len() == 1 })
	down.Store(true)
	lost.Store(true)
	b.srv.onAccessLogEntry(connectFailureEntry(pt.Decision, route, 1))
	down.Store(false)
	lost.Store(false)
	a.clk.Advance(lifecycle.ResendEvery)
	eventually(t, "the connect failure recorded", func() bool {
		return a.outcomes(route, "failure", "connection_error")+b.outcomes(route, "failure", "connection_error") == 1
	})
	a.clk.Advance(lifecycle.ParkFor)
	if n := a.outcomes(route, "neither", "no_outcome"); n != 0 {
		t.Fatal("attempt 1 also became a neither")
	}
	if s := a.status("default", route); s.Failures != 1 {
		t.Fatalf("one connect failure: %d failures", s.Failures)
	}
}

// R-DL2, R-DL12 (#49, found by lifecycle.TestTwoReplicasStoreAnswers): an
// attempt parks while the store does not answer, and its park time ends
// before the store answers again: a neither frees its slot. Envoy's entry
// for it then reaches the note on another replica. Before, the attempt was
// gone for good and the entry waited in a note nobody read: the connect
// failure was recorded nowhere. Now the park is still written after its
// wait ended ("gone"), meets the entry, and the failure is recorded, late.
func TestAParkThatEndedAloneStillMeetsItsEntry(t *testing.T) {
	down := new(atomic.Bool)
	a := newFailoverEnv(t, func(o *Options) { o.Store = blipNotes{Store: o.Store, down: down} })
	b := newFailoverEnv(t, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, a.clk })
	tok := a.routeRole()
	pt, err := a.srv.parseAttemptToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	route := pt.Chain[0].Route
	down.Store(true)
	c, _, _ := a.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end() // parks here alone
	eventually(t, "attempt 1 parked here alone", func() bool { return a.srv.meet.len() == 1 })
	a.clk.Advance(lifecycle.ParkFor)
	eventually(t, "its wait ended: a neither", func() bool { return a.outcomes(route, "neither", "no_outcome") == 1 })
	down.Store(false)
	b.srv.onAccessLogEntry(connectFailureEntry(pt.Decision, route, 1))
	for range 8 {
		a.clk.Advance(lifecycle.ResendEvery)
	}
	eventually(t, "the connect failure recorded, late", func() bool {
		return a.outcomes(route, "failure", "connection_error")+b.outcomes(route, "failure", "connection_error") == 1
	})
	eventually(t, "the attempt let go", func() bool { return a.srv.meet.len() == 0 })
}
