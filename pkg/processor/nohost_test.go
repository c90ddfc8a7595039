package processor

import (
	"testing"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

var uh = &accesslogdatav3.ResponseFlags{NoHealthyUpstream: true}

// R-AL5 (#49): an NC or UH entry charges only what its decision sealed.
// Three entries with made-up ids that name a route in their own chain and
// gateway fields charge nothing, in the plain deployment and the failover
// one, and count as unknown decisions. Before, they opened the
// threshold-2 route.
func TestForgedNoHostEntriesChargeNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		env  func(*testing.T, ...func(*Options)) *env
		tok  func(*env) string // a token of another decision, or none
	}{
		{"plain deployment", newEnv, func(*env) string { return "" }},
		{"failover deployment", newFailoverEnv, func(*env) string { return "" }},
		{"failover, another decision's token", newFailoverEnv, func(e *env) string { return e.routeRole() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := c.env(t)
			tok := c.tok(e)
			for range 3 {
				e.srv.onAccessLogEntry(chainEntry(lifecycle.NewDecisionID(), "openai:us:gpt,azure:eu:gpt", tok, 1, uh))
			}
			if s := e.status("default", "openai:us:gpt"); s.State != "closed" || s.Failures != 0 {
				t.Fatalf("three forged no-host entries: %s with %d failures", s.State, s.Failures)
			}
			if n := e.entries(EntryUnknown); n != 3 {
				t.Fatalf("%v entries counted unknown, want 3", n)
			}
		})
	}
}

// R-AL5 (#49): failover, first attempt. Envoy answers 503 UH (or NC) before
// it sets the attempt count, so the entry has none, and it never retries a
// no-host reply. The entry is attempt 1 and charges the chain's first route
// with a connection error. Before, an entry with no attempt count charged
// nothing, and a route with no healthy host was chosen for ever.
func TestFirstAttemptNoHostIsCharged(t *testing.T) {
	e := newFailoverEnv(t)
	for range 2 {
		tok := e.routeRole()
		pt, err := e.srv.parseAttemptToken(tok)
		if err != nil {
			t.Fatal(err)
		}
		e.srv.onAccessLogEntry(chainEntry(pt.Decision, pt.Chain[0].Route+","+pt.Chain[1].Route, tok, 0, uh))
	}
	e.waitOutcomes("openai:us:gpt", "failure", "connection_error", 2)
	if s := e.status("default", "openai:us:gpt"); s.State != "open" {
		t.Fatalf("two no-host replies on the first route: %+v", s)
	}
}

// R-DL5 (#49): a flood of no-host entries for made-up decisions (naming a
// chain in their own fields) goes through the budget for unknown decisions:
// it never fills the note table that real parked attempts wait in. The
// genuine retried attempt after it is a connection error, not a neither.
// Before, such entries skipped the budget: the table held 131,072 notes and
// the park that followed found no room.
func TestNoHostEntryFloodKeepsRealParks(t *testing.T) {
	e := newFailoverEnv(t)
	for range 140000 {
		e.srv.onAccessLogEntry(chainEntry(lifecycle.NewDecisionID(), "openai:us:gpt,azure:eu:gpt", "", 1, uh))
	}
	tok := e.routeRole()
	c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
	c.end() // refused: Envoy resets the attempt and retries it
	eventually(t, "attempt 1 parked", func() bool { return e.srv.meet.len() == 1 })
	c2, _, _ := e.attempt(tok, "r-1", 2, "/v1/chat/completions")
	defer c2.end()
	e.waitOutcomes("openai:us:gpt", "failure", "connection_error", 1)
}
