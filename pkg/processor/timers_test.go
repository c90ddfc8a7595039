package processor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// A timerSet keeps a call until it runs or is stopped, and Stop ends every
// call, then and later.
func TestTimerSet(t *testing.T) {
	for _, c := range []struct {
		name    string
		do      func(ts *timerSet, clk *breaker.FakeClock, ran *int) breaker.Timer
		advance time.Duration
		ran     int
		pending int
	}{
		{"a due call runs once and leaves", func(ts *timerSet, clk *breaker.FakeClock, ran *int) breaker.Timer {
			return ts.after(clk, time.Second, func() { *ran++ })
		}, 2 * time.Second, 1, 0},
		{"a call not due waits", func(ts *timerSet, clk *breaker.FakeClock, ran *int) breaker.Timer {
			return ts.after(clk, time.Minute, func() { *ran++ })
		}, time.Second, 0, 1},
		{"a stopped call never runs", func(ts *timerSet, clk *breaker.FakeClock, ran *int) breaker.Timer {
			tm := ts.after(clk, time.Second, func() { *ran++ })
			if !tm.Stop() || tm.Stop() {
				t.Error("Stop: true once, then false")
			}
			return tm
		}, 2 * time.Second, 0, 0},
		{"the set's stop ends every call", func(ts *timerSet, clk *breaker.FakeClock, ran *int) breaker.Timer {
			ts.after(clk, time.Second, func() { *ran++ })
			tm := ts.after(clk, 300*time.Second, func() { *ran++ })
			ts.stop()
			return tm
		}, 301 * time.Second, 0, 0},
		{"a call armed after the stop never runs", func(ts *timerSet, clk *breaker.FakeClock, ran *int) breaker.Timer {
			ts.stop()
			return ts.after(clk, time.Second, func() { *ran++ })
		}, 2 * time.Second, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ts timerSet
			clk := breaker.NewFakeClock(time.Unix(1_700_000_000, 0))
			ran := 0
			c.do(&ts, clk, &ran)
			clk.Advance(c.advance)
			if ran != c.ran || ts.pending() != c.pending {
				t.Fatalf("ran %d, %d pending; want %d, %d", ran, ts.pending(), c.ran, c.pending)
			}
		})
	}
}

// A stopped server's decisions wait no more (#54): the observer profile's
// decision waits decision_wait_sec (300 s) on a timer that held the whole
// server, its tables and its store; the fleet soak's memory check found
// two of ten restarted fuseboxes still held after the load (7.5 MiB of
// their Redis stores). Stop ends the wait: nothing is recorded for it on
// the stopped server (its note, in the store, outlives it).
func TestStopEndsTheDecisionsWaits(t *testing.T) {
	e := newObserverEnv(t)
	e.observedDecision("gpt")
	eventually(t, "the decision waits", func() bool { return e.srv.timers.pending() > 0 })
	e.srv.Stop()
	if n := e.srv.timers.pending(); n != 0 {
		t.Fatalf("%d calls still pending after Stop", n)
	}
	e.clk.Advance(301 * time.Second)
	if n := e.outcomes("openai:us:gpt", "neither", "no_outcome"); n != 0 {
		t.Fatalf("a stopped server recorded %v neithers for its waits", n)
	}
}

// failingNotes is a store whose note calls get no answer (Redis gone).
type failingNotes struct{ *breaker.Memory }

func (failingNotes) SwapNote(context.Context, string, []byte, []byte, time.Duration) ([]byte, bool, error) {
	return nil, false, errors.New("no answer")
}

// A resend (an operation whose answer was unknown) goes on until the
// record key's life ends, 10 minutes or more: its timers are the
// server's, and Stop ends them (#54: the fleet soak under load held 4 of
// 9 restarted fuseboxes, their stores and journals, after its fix for
// the decisions' waits; the resends kept them).
func TestStopEndsTheResends(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Store = failingNotes{breaker.NewMemory(nil)} })
	ran := 0
	e.srv.meet.notes.Resend("d-stop", "arrival", lifecycle.Op{ID: lifecycle.NewOpID('a'), Arrive: 2}, func(lifecycle.Act) { ran++ })
	if n := e.srv.timers.pending(); n != 1 {
		t.Fatalf("%d calls pending after a resend, want its timer", n)
	}
	e.clk.Advance(time.Second) // the first try: no answer, armed again
	if n := e.srv.timers.pending(); n != 1 {
		t.Fatalf("%d calls pending after an unanswered try", n)
	}
	e.srv.Stop()
	if n := e.srv.timers.pending(); n != 0 {
		t.Fatalf("%d calls pending after Stop", n)
	}
	e.clk.Advance(20 * time.Minute)
	if ran != 0 {
		t.Fatal("a stopped server's resend ran on")
	}
}
