package processor

import (
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// R-AL4 on the route role's own channel: an answer that began and broke
// before its end is a neither, and what broke it is Envoy's to say. The
// route role's stream ends the same way whether the client went away or
// one of Envoy's timers cut the answer, so an entry that reached this
// replica first gives the label (Envoy writes the access log before it
// destroys the filters): cut_mid_answer for UT or SI, client_cancel for
// DC or DR. A stream's end that comes first is a client_cancel at once,
// and the entry after it a duplicate. Before, every such break was a
// client_cancel on this channel.
func TestABrokenAnswerTakesTheEntrysLabel(t *testing.T) {
	cases := []struct {
		name       string
		entryFirst bool
		flags      *accesslogdatav3.ResponseFlags
		reason     string
	}{
		{"route timeout, the entry first", true, ut, "cut_mid_answer"},
		{"stream idle timeout, the entry first", true, si, "cut_mid_answer"},
		{"route timeout, the stream's end first", false, ut, "client_cancel"},
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
				return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", reason))
			}
			eventually(t, "the neither is recorded with its label", func() bool { return outcome(tc.reason) == 1 })
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
