package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// A drained backlog holds nothing (#49, the fleet soak's memory check):
// answered outcomes leave no copy behind in the slots they vacate, and an
// empty backlog keeps no backing array from its burst. Before, answering
// 1,000 outcomes left a 1,000-slot array holding every one of them.
func TestADrainedBacklogHoldsNothing(t *testing.T) {
	var v view
	for i := 1; i <= 1000; i++ {
		v.fl.pending = append(v.fl.pending, ownOutcome{tok: uint64(i), res: breaker.Result{Key: "d" + strconv.Itoa(i) + ":1"}})
	}
	v.answeredUpTo(400)
	if len(v.fl.pending) != 600 {
		t.Fatalf("%d pending, want 600", len(v.fl.pending))
	}
	for _, o := range v.fl.pending[len(v.fl.pending):cap(v.fl.pending)] {
		if o.res.Key != "" {
			t.Fatalf("a vacated slot still holds an answered outcome (%s)", o.res.Key)
		}
	}
	v.answeredUpTo(1000)
	if cap(v.fl.pending) != 0 {
		t.Fatalf("an empty backlog keeps a %d-slot array", cap(v.fl.pending))
	}
	s := &Store{}
	e := &entry{}
	for i := range maxUnsent + 5 {
		s.owe(e, recJob{op: "rec", res: breaker.Result{Key: strconv.Itoa(i)}})
	}
	u := e.fl.unsent
	for _, j := range u[len(u):cap(u)] {
		if j.res.Key != "" {
			t.Fatalf("a dropped unsent call is still held (%s)", j.res.Key)
		}
	}
}

// A worker's overflow, once taken, keeps no job alive in its vacated
// slots (#49, the fleet soak's memory check).
func TestATakenOverflowHoldsNothing(t *testing.T) {
	s := &Store{over: make([]overflow, 1)}
	for i := range 300 {
		s.over[0].jobs = append(s.over[0].jobs, recJob{op: "rec", res: breaker.Result{Key: strconv.Itoa(i)}})
	}
	batch := s.takeOverflow(0, nil)
	if len(batch) != maxBatch {
		t.Fatalf("took %d, want %d", len(batch), maxBatch)
	}
	left := s.over[0].jobs
	for _, j := range left[len(left):cap(left)] {
		if j.res.Key != "" {
			t.Fatalf("a taken job is still held by the overflow (%s)", j.res.Key)
		}
	}
	s.takeOverflow(0, nil)
	if cap(s.over[0].jobs) != 0 {
		t.Fatalf("an empty overflow keeps a %d-slot array", cap(s.over[0].jobs))
	}
}

// An operator's override that Redis answers while the local view is the
// store (degraded: another call failed meanwhile) moves the view's own
// chain, and the chain says so (#54). Before, the view was restored with
// no line: the fleet soak under load read a local "open->closed after
// closed" when the force ran out.
func TestAnOverrideAnsweredWhileDegradedIsTheViewsOwnTransition(t *testing.T) {
	clk := breaker.NewFakeClock(time.Unix(1_700_000_000, 0))
	var got []breaker.Event
	s := New(Options{Clock: clk, OnEvent: func(ev breaker.Event) { got = append(got, ev) }})
	e := installOne(t, s, clk)
	now := clk.Now().UnixNano()
	for _, c := range []struct {
		name     string
		degraded bool
		snap     breaker.Snapshot
		reason   string
		want     string // "" = no line
	}{
		{"synced: the script's own line says it", false, breaker.Snapshot{State: breaker.Open, Generation: 2, Reason: breaker.ReasonForced, Forced: true, OpenedAt: now}, breaker.ReasonForced, ""},
		{"synced: a close too", false, breaker.Snapshot{State: breaker.Closed, Generation: 3}, breaker.ReasonForceClose, ""},
		{"degraded: force-open", true, breaker.Snapshot{State: breaker.Open, Generation: 4, Reason: breaker.ReasonForced, Forced: true, OpenedAt: now}, breaker.ReasonForced, "closed->open forced local"},
		{"degraded: the same state again", true, breaker.Snapshot{State: breaker.Open, Generation: 5, Reason: breaker.ReasonForced, Forced: true, OpenedAt: now}, breaker.ReasonForced, ""},
		{"degraded: reset", true, breaker.Snapshot{State: breaker.Closed, Generation: 6}, breaker.ReasonReset, "open->closed reset local"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.sync.p.Store(int32(synced))
			if c.degraded {
				s.sync.step(callFailed)
			}
			got = nil
			s.apply(e, "inc", c.snap.Generation, c.snap, answer{kind: answerOverride, reason: c.reason})
			var lines []string
			for _, ev := range got {
				lines = append(lines, ev.From.String()+"->"+ev.To.String()+" "+ev.Reason+" "+ev.DecidedBy)
			}
			if strings.Join(lines, "; ") != c.want {
				t.Fatalf("lines %q, want %q", lines, c.want)
			}
			if snap, _ := breaker.SnapshotOf(s.local, e.lk(), now); snap.State != c.snap.State {
				t.Fatalf("the view is %v, want %v", snap.State, c.snap.State)
			}
		})
	}
}

// A reload while an outcome is in flight (#54): the record job and the
// answer matched by its token hold the entry they were queued on. The
// installed breaker must be that entry, so that the answer reaches the
// view the decisions read, and the unanswered failure keeps guarding it
// meanwhile. Before, Install built a new entry: it held no pending
// failure (an older answer could re-admit the route under it) and the
// answer went to an entry no longer installed.
func TestAReloadKeepsTheOutcomesInFlight(t *testing.T) {
	clk := breaker.NewFakeClock(time.Unix(1_700_000_000, 0))
	s := New(Options{Clock: clk})
	id := breaker.ID{Gateway: "default", Route: "openai:us-east:gpt-4o-mini"}
	pol := breaker.DefaultPolicy()
	install := func() breaker.Key {
		t.Helper()
		keys, _, err := s.Install(context.Background(), clk.Now().UnixNano(), []breaker.Spec{{ID: id, Policy: pol.Finish()}})
		if err != nil {
			t.Fatal(err)
		}
		return keys[0]
	}
	k := install()
	queued, err := s.get(k)
	if err != nil {
		t.Fatal(err)
	}
	now := clk.Now().UnixNano()
	tok, _ := s.recordOwn(context.Background(), queued, now, breaker.Admission{Gen: 1}, breaker.Result{Kind: breaker.KindStatus, Status: 503}, true)
	s.owe(queued, recJob{e: queued, op: "rec", now: now, res: breaker.Result{Kind: breaker.KindStatus, Status: 503}})

	installed, err := s.get(install())
	if err != nil {
		t.Fatal(err)
	}
	installed.viewMu.Lock()
	pending, unsent := installed.failurePending(), len(installed.fl.unsent)
	installed.viewMu.Unlock()
	if !pending || unsent != 1 {
		t.Fatalf("after the reload the breaker holds pending failure %v, %d unsent outcomes; want true, 1", pending, unsent)
	}
	s.apply(queued, "inc", 1, breaker.Snapshot{State: breaker.Closed, Generation: 1}, answer{kind: answerRecord, tok: tok})
	installed.viewMu.Lock()
	pending = installed.failurePending()
	installed.viewMu.Unlock()
	if pending {
		t.Fatal("the answer to the outcome in flight did not reach the installed breaker")
	}
}

// An answer whose apply was decided while Redis was the store, and whose
// restore comes after the store turned degraded and the view made (and
// logged) a transition of its own, must not put Redis's state silently
// under that transition (#54, the fleet soak under load, loaded run F4: a
// local "open->half_open after half_open"). Before, apply chose to
// restore, then restored: the view was closed again with no line while its
// chain's last line said open. The choice is now made under the breaker's
// lock, in one step with the restore.
func TestAnAnswerNeverLandsUnderTheViewsOwnTransition(t *testing.T) {
	clk := breaker.NewFakeClock(time.Unix(1_700_000_000, 0))
	var got []breaker.Event
	s := New(Options{Clock: clk, OnEvent: func(ev breaker.Event) { got = append(got, ev) }})
	e := installOne(t, s, clk)
	now := clk.Now().UnixNano()
	applyHook = func() {
		// Meanwhile: a call fails, and the view, now the store, opens.
		s.sync.step(callFailed)
		if err := s.local.ForceOpen(context.Background(), e.lk(), now, time.Minute); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { applyHook = nil })
	s.apply(e, "inc", 5, breaker.Snapshot{State: breaker.Closed, Generation: 5}, answer{kind: answerRead})
	if len(got) != 1 || got[0].DecidedBy != breaker.DecidedByLocal {
		t.Fatalf("local lines %v, want the view's own open", got)
	}
	snap, _ := breaker.SnapshotOf(s.local, e.lk(), now)
	if snap.State != got[0].To {
		t.Fatalf("the view is %v, and its chain's last line says %v", snap.State, got[0].To)
	}
}

// installOne installs one breaker with the default policy on s and
// returns its entry.
func installOne(t *testing.T, s *Store, clk breaker.Clock) *entry {
	t.Helper()
	pol := breaker.DefaultPolicy()
	id := breaker.ID{Gateway: "default", Route: "openai:us-east:gpt-4o-mini"}
	keys, _, err := s.Install(context.Background(), clk.Now().UnixNano(), []breaker.Spec{{ID: id, Policy: pol.Finish()}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.get(keys[0])
	if err != nil {
		t.Fatal(err)
	}
	return e
}
