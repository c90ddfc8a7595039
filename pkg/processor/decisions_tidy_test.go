package processor

import (
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// An idle decision table lets go: the done generations rotate on time and
// a live map that held a burst is made again at its size.
func TestDecisionTableTidy(t *testing.T) {
	tab := newDecisionTable()
	for i := 0; i < 3000; i++ {
		tab.add(&stream{decisionID: fmt.Sprint("d", i)})
	}
	for i := 0; i < 3000; i++ {
		tab.forget(fmt.Sprint("d", i), 2*time.Second, true, false)
	}
	if done, _ := tab.wasDone("d1"); !done {
		t.Fatal("a decision just done is not remembered")
	}
	now := time.Now()
	tab.tidy(now.Add(3 * time.Second))
	tab.tidy(now.Add(6 * time.Second))
	if done, _ := tab.wasDone("d1"); done {
		t.Fatal("an idle table still remembers a decision two generations old")
	}
	if tab.peak != 0 || tab.len() != 0 {
		t.Fatalf("live map kept at peak %d (%d live)", tab.peak, tab.len())
	}
}

// The table remembers a settled decision for two access_log.wait_ms
// generations, however long the decision waited before it settled. Before,
// a decision that waited decision_wait_sec (300 s, the observer profile)
// passed that as the table's generation length: every decision settled
// after it was remembered for up to 10 minutes, ids a late entry no longer
// needs (the observer soak: 1,400 of them, 0.5 MiB, after a load that ran
// late; at 500 requests a second, 300,000).
func TestALongWaitDoesNotStretchTheTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(e *env, md *corev3.Metadata)
	}{
		{"observed", func(e *env, md *corev3.Metadata) {
			e.observe(md, "503", `{"error":{}}`)
			eventually(t, "the 503 is recorded", func() bool { return e.status("default", "openai:us:gpt").Failures == 1 })
		}},
		{"expired", func(e *env, md *corev3.Metadata) {
			e.clk.Advance(301 * time.Second)
			eventually(t, "a neither after decision_wait_sec", func() bool { return e.outcomes("openai:us:gpt", "neither", "no_outcome") == 1 })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newObserverEnv(t)
			md := e.observedDecision("gpt")
			tc.settle(e, md)
			eventually(t, "the decision settles", func() bool { return e.srv.decisions.len() == 0 })
			wait := e.srv.cfg.Load().AccessLogWait
			now := time.Now()
			e.srv.decisions.tidy(now.Add(wait + time.Second))
			e.srv.decisions.tidy(now.Add(2*wait + 2*time.Second))
			if n := e.srv.DecisionsKept(); n != 0 {
				t.Fatalf("%d decisions kept two access_log.wait_ms generations (%s) after the last settled", n, wait)
			}
		})
	}
}
