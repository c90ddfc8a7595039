package processor

import (
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// R-AL4 on the route role's own channel: an answer that began and broke
// before its end is a neither, and what broke it is Envoy's to say. The
// route role's stream ends the same way whether the client went away or
// one of Envoy's timers cut the answer, so an entry that reached this
// replica first gives the label (Envoy writes the access log before it
// destroys the filters): cut_mid_answer for UT or SI, client_cancel for
// DC or DR, stream_error for UR. An entry after the stream's end labels it
// too: the neither waits access_log.wait_ms on this replica for it, and is
// a client_cancel when none comes. Before, every such break was a
// client_cancel on this channel unless the entry came first.
func TestABrokenAnswerTakesTheEntrysLabel(t *testing.T) {
	cases := []struct {
		name       string
		entryFirst bool
		flags      *accesslogdatav3.ResponseFlags
		reason     string
	}{
		{"route timeout, the entry first", true, ut, "cut_mid_answer"},
		{"stream idle timeout, the entry first", true, si, "cut_mid_answer"},
		// The entry after the stream's end still labels it (it waits
		// access_log.wait_ms on this replica). Before, a client_cancel.
		{"route timeout, the stream's end first", false, ut, "cut_mid_answer"},
		{"upstream reset, the stream's end first", false, ur, "stream_error"},
		{"client went away", false, dc, "client_cancel"},
		{"HTTP/2 client reset, the entry first", true, dr, "client_cancel"},
		{"upstream reset, the entry first", true, ur, "stream_error"},
		{"no entry", false, nil, "client_cancel"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			al := e.accessLog()
			c := e.open("")
			id := decisionOf(t, c.chat("gpt"))
			c.respHeaders("200", false, nil, "content-type", "text/event-stream")
			c.respBody(`data: {"choices":[{"delta":{"content":"Hel`, false)
			entry := logEntry{decision: id, cluster: "c_openai_us", code: 200, details: "via_upstream", flags: tc.flags}
			if tc.entryFirst {
				al.send(entry)
				eventually(t, "the entry is read", func() bool { return e.entries(EntryRecorded) == 1 })
			}
			c.end()
			if !tc.entryFirst && tc.flags != nil {
				al.send(entry)
			}
			outcome := func(reason string) float64 {
				return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", reason, breaker.OriginLabel("neither", reason)))
			}
			if tc.flags == nil {
				// No entry: a client_cancel once the wait is over, not before.
				if outcome(tc.reason) != 0 {
					t.Fatal("recorded before access_log.wait_ms passed")
				}
				e.clk.Advance(3 * time.Second)
			}
			eventually(t, "the neither is recorded with its label", func() bool { return outcome(tc.reason) == 1 })
			if n := e.srv.labels.waiting(); n != 0 {
				t.Fatalf("%d broken answers still wait for a label", n)
			}
			for _, other := range []string{"client_cancel", "cut_mid_answer", "stream_error", "no_outcome"} {
				if other != tc.reason && outcome(other) != 0 {
					t.Fatalf("also recorded as %s", other)
				}
			}
		})
	}
}

// The probe slot of a broken answer is free at the stream's end, whatever
// the entry says later: a half-open route takes its next probe at once.
func TestABrokenProbeFreesItsSlotAtTheStreamsEnd(t *testing.T) {
	e := newEnv(t)
	e.accessLog()
	e.openRoute("default", "openai:us:gpt")
	e.clk.Advance(11 * time.Second) // past cooldown_ms: half-open
	c := e.open("")
	c.chat("gpt")
	if s := e.status("default", "openai:us:gpt"); s.ProbesInFlight != 1 {
		t.Fatalf("the probe holds no slot: %+v", s)
	}
	c.respHeaders("200", false, nil, "content-type", "text/event-stream")
	c.respBody(`data: {"choices":[{"delta":{"content":"Hel`, false)
	c.end()
	eventually(t, "the slot is free", func() bool { return e.status("default", "openai:us:gpt").ProbesInFlight == 0 })
}
