package processor

import (
	"fmt"
	"strings"
)

// The lifecycle of a decision's note (SPEC §4b, R-DL1, R-DL2): one table of
// transitions that every channel drives — the route role's stream end
// (park 0), an attempt that ended before headers (park n), the park's end
// (expire), the next attempt's arrival, an access log entry, and the
// observer. docs/decisions.md is this table written out (renderNoteTable;
// TestDecisionsDocMatchesTable holds them together).
//
// The rows are tried in order; the first whose event matches and whose
// guard holds applies. A row's effect is the next note and what to record:
// a claim (the parked party, recorded by whoever made the claim, on any
// replica) or nothing. The promises the rows keep (TestNoteLifecycleOrders
// enumerates every order of each deployment's events):
//   - exactly one real record per decision (N 0) and per attempt number;
//   - a real outcome beats an expiry: an expiry frees the probe slot (a
//     neither) and keeps the note, so a real outcome that comes later is
//     still recorded, late, and without the slot;
//   - an event that comes again (a replayed observer note or attempt park,
//     a second entry) records nothing and is counted as a duplicate.

// noteEvent is what reached a decision's note.
type noteEvent uint8

const (
	evPark noteEvent = iota
	evExpire
	evArrive
	evEntry
	evObserve
)

var noteEventNames = [...]string{"park", "expire", "arrive", "entry", "observe"}

func (e noteEvent) String() string { return noteEventNames[e] }

func (op meetOp) event() noteEvent {
	switch {
	case op.observe:
		return evObserve
	case op.expire:
		return evExpire
	case op.park != nil:
		return evPark
	case op.arrive > 0:
		return evArrive
	}
	return evEntry
}

// noteRow is one transition.
type noteRow struct {
	ev    noteEvent
	when  string // the guard, in words (docs/decisions.md)
	next  string // the note after it, in words
	rec   string // what is recorded, in words
	guard func(n *attemptNote, op meetOp) bool
	apply func(n *attemptNote, op meetOp) meetAct
}

func always(*attemptNote, meetOp) bool { return true }

// recordedAttempt reports whether attempt n's outcome was recorded through
// the note (one record per attempt number, R-DL4).
func (n *attemptNote) recordedAttempt(a int) bool {
	return a >= 1 && a <= 63 && n.Rec&(1<<a) != 0
}

func (n *attemptNote) markRecorded(a int) {
	if a >= 1 && a <= 63 {
		n.Rec |= 1 << a
	}
}

func (n *attemptNote) markArrived(a int) {
	if a >= 1 && a <= 63 {
		n.Arr |= 1 << a
	}
}

// settled: the decision's own outcome (N 0) is recorded, by an entry, the
// observer, or the route role itself.
func (n *attemptNote) settled() bool { return n.Done || n.Obs }

// claimParked takes the parked party out of the note as the one to record.
func (n *attemptNote) claimParked(how meetHow, res entryOutcome) meetAct {
	q := n.Parked
	act := meetAct{how: how, claim: q, res: res, late: n.Expired}
	n.Parked, n.Expired = nil, false
	if q.N == 0 {
		n.Done = true
	} else {
		n.markRecorded(q.N)
	}
	return act
}

// maxEarlyEntries bounds the early entries one note keeps.
const maxEarlyEntries = 4

// matchingEntry is the first early entry that p matches, or -1.
func (n *attemptNote) matchingEntry(p *parkedNote) int {
	if n.Entry != nil && n.Entry.outcome().matchesNote(p) {
		return 0
	}
	for i := range n.More {
		if n.More[i].outcome().matchesNote(p) {
			return i + 1
		}
	}
	return -1
}

// takeEntry removes and returns early entry i (matchingEntry's index).
func (n *attemptNote) takeEntry(i int) entryOutcome {
	if i == 0 {
		out := n.Entry.outcome()
		n.Entry = nil
		if len(n.More) > 0 {
			e := n.More[0]
			n.Entry, n.More = &e, n.More[1:]
		}
		if len(n.More) == 0 {
			n.More = nil
		}
		return out
	}
	out := n.More[i-1].outcome()
	n.More = append(n.More[:i-1:i-1], n.More[i:]...)
	if len(n.More) == 0 {
		n.More = nil
	}
	return out
}

// addEntry keeps an early entry, unless one like it is kept or the note
// holds maxEarlyEntries already.
func (n *attemptNote) addEntry(o *entryOutcome) {
	e := entryNote{Res: o.res, Cluster: o.cluster, Attempt: o.attempt}
	if n.Entry == nil {
		n.Entry = &e
		return
	}
	if *n.Entry == e {
		return
	}
	for _, m := range n.More {
		if m == e {
			return
		}
	}
	if 1+len(n.More) < maxEarlyEntries {
		n.More = append(append([]entryNote(nil), n.More...), e)
		return
	}
	// Full: Envoy writes one entry per request, for its last attempt, so
	// the entry of the highest attempt is the one a park will match; one
	// for an earlier attempt gives way to it.
	low := -1 // -1: Entry; i: More[i]
	lowAttempt := n.Entry.Attempt
	for i, m := range n.More {
		if m.Attempt < lowAttempt {
			low, lowAttempt = i, m.Attempt
		}
	}
	if e.Attempt <= lowAttempt {
		return
	}
	n.More = append([]entryNote(nil), n.More...)
	if low < 0 {
		n.Entry = &e
	} else {
		n.More[low] = e
	}
}

var noteTable = []noteRow{
	// The observer (observe.go): one observer record per decision.
	{ev: evObserve, when: "the decision is settled (observed, or recorded from an entry)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *attemptNote, _ meetOp) bool { return n.settled() },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetDuplicate} }},
	{ev: evObserve, when: "the route role's decision waits (parked N 0, or its wait ended)", next: "observed", rec: "the observer records (late, without the slot, after the wait ended)",
		guard: func(n *attemptNote, _ meetOp) bool { return n.Parked != nil && n.Parked.N == 0 },
		apply: func(n *attemptNote, _ meetOp) meetAct {
			act := n.claimParked(meetObserved, entryOutcome{})
			n.Obs = true
			return act
		}},
	{ev: evObserve, when: "an attempt is parked (the failover deployment has no observer)", next: "unchanged", rec: "nothing (mismatch)",
		guard: func(n *attemptNote, _ meetOp) bool { return n.Parked != nil },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetMismatch} }},
	{ev: evObserve, when: "otherwise (the observer came first; an early entry is dropped)", next: "observed", rec: "the observer records",
		guard: always,
		apply: func(n *attemptNote, _ meetOp) meetAct {
			n.Obs, n.Entry = true, nil
			return meetAct{how: meetObserveFirst}
		}},

	// The route role's stream ended with no response (park N 0).
	{ev: evPark, when: "N 0, the decision is settled", next: "settled (the park seen)", rec: "nothing (the observer or an entry records)",
		guard: func(n *attemptNote, op meetOp) bool { return op.park.N == 0 && n.settled() },
		apply: func(n *attemptNote, _ meetOp) meetAct {
			n.Done = true
			return meetAct{how: meetByObserver}
		}},
	{ev: evPark, when: "N 0, an early entry matches", next: "settled", rec: "the entry's outcome",
		guard: func(n *attemptNote, op meetOp) bool { return op.park.N == 0 && n.matchingEntry(op.park) >= 0 },
		apply: func(n *attemptNote, op meetOp) meetAct {
			out := n.takeEntry(n.matchingEntry(op.park))
			n.Entry, n.More, n.Done = nil, nil, true
			return meetAct{how: meetEntry, claim: op.park, res: out}
		}},
	{ev: evPark, when: "N 0, parked already (waiting or expired)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *attemptNote, op meetOp) bool { return op.park.N == 0 && n.Parked != nil && n.Parked.N == 0 },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetDuplicate} }},
	{ev: evPark, when: "N 0, otherwise", next: "parked N 0", rec: "nothing yet (waits decision_wait_sec or access_log.wait_ms)",
		guard: func(_ *attemptNote, op meetOp) bool { return op.park.N == 0 },
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.Parked, n.Expired = op.park, false
			return meetAct{how: meetParked}
		}},

	// An attempt ended before response headers (park n ≥ 1).
	{ev: evPark, when: "attempt n was recorded already (a replayed token)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *attemptNote, op meetOp) bool { return n.recordedAttempt(op.park.N) },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetDuplicate} }},
	{ev: evPark, when: "attempt n is parked already, waiting or expired (a replayed park)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *attemptNote, op meetOp) bool { return n.Parked != nil && n.Parked.N == op.park.N },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetDuplicate} }},
	{ev: evPark, when: "a later attempt arrived already (Later > n)", next: "attempt n recorded; Later kept", rec: "connection_error for attempt n",
		guard: func(n *attemptNote, op meetOp) bool { return n.Later > op.park.N },
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.markRecorded(op.park.N)
			return meetAct{how: meetConnErr, claim: op.park}
		}},
	{ev: evPark, when: "an early entry names attempt n (or no attempt) and its cluster", next: "attempt n recorded", rec: "the entry's outcome",
		guard: func(n *attemptNote, op meetOp) bool { return n.matchingEntry(op.park) >= 0 },
		apply: func(n *attemptNote, op meetOp) meetAct {
			out := n.takeEntry(n.matchingEntry(op.park))
			n.markRecorded(op.park.N)
			return meetAct{how: meetEntry, claim: op.park, res: out}
		}},
	{ev: evPark, when: "a later attempt is parked already", next: "unchanged; attempt n recorded", rec: "connection_error for attempt n (Envoy retried it)",
		guard: func(n *attemptNote, op meetOp) bool { return n.Parked != nil && n.Parked.N > op.park.N },
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.markRecorded(op.park.N)
			return meetAct{how: meetConnErr, claim: op.park}
		}},
	{ev: evPark, when: "otherwise", next: "parked n (an earlier parked attempt is claimed)", rec: "nothing yet for n; connection_error for the earlier one",
		guard: always,
		apply: func(n *attemptNote, op meetOp) meetAct {
			act := meetAct{how: meetParked}
			if q := n.Parked; q != nil && q.N < op.park.N && q.N > 0 {
				act.older, act.olderLate = q, n.Expired
				n.markRecorded(q.N)
			}
			n.Parked, n.Expired = op.park, false
			return act
		}},

	// The park's time ended.
	{ev: evExpire, when: "its own park waits", next: "expired (kept for a late outcome)", rec: "a neither that frees its probe slot",
		guard: func(n *attemptNote, op meetOp) bool { return n.Parked != nil && !n.Expired && *n.Parked == *op.park },
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.Expired = true
			return meetAct{how: meetNeither, claim: op.park}
		}},
	{ev: evExpire, when: "otherwise (claimed, or another park since)", next: "unchanged", rec: "nothing",
		guard: always, apply: func(*attemptNote, meetOp) meetAct { return meetAct{} }},

	// Attempt n of the request began.
	{ev: evArrive, when: "attempt n arrived already (a replayed token)", next: "unchanged", rec: "nothing: the replay's attempt records nothing (duplicate)",
		guard: func(n *attemptNote, op meetOp) bool { return op.arrive <= 63 && n.Arr&(1<<op.arrive) != 0 },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetDuplicate} }},
	{ev: evArrive, when: "an earlier attempt is parked", next: "attempt recorded; Later = max(Later, n)", rec: "connection_error for the parked attempt",
		guard: func(n *attemptNote, op meetOp) bool {
			return n.Parked != nil && n.Parked.N > 0 && n.Parked.N < op.arrive
		},
		apply: func(n *attemptNote, op meetOp) meetAct {
			act := n.claimParked(meetConnErr, entryOutcome{})
			n.Later = max(n.Later, op.arrive)
			n.markArrived(op.arrive)
			return act
		}},
	{ev: evArrive, when: "otherwise", next: "Later = max(Later, n)", rec: "nothing",
		guard: always,
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.Later = max(n.Later, op.arrive)
			n.markArrived(op.arrive)
			return meetAct{}
		}},

	// Envoy's access log entry (R-AL3, R-AL5).
	{ev: evEntry, when: "the decision is settled", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *attemptNote, _ meetOp) bool { return n.settled() },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetByObserver} }},
	{ev: evEntry, when: "a parked party matches (its attempt, or any for N 0; its cluster, or none named)", next: "its attempt recorded", rec: "the entry's outcome (late, without the slot, after the park ended)",
		guard: func(n *attemptNote, op meetOp) bool { return n.Parked != nil && op.entry.matchesNote(n.Parked) },
		apply: func(n *attemptNote, op meetOp) meetAct { return n.claimParked(meetEntry, *op.entry) }},
	{ev: evEntry, when: "NC/UH (no cluster) for a later attempt than the parked one", next: "parked attempt recorded; Later = the entry's attempt", rec: "connection_error for the parked attempt; the entry for its own attempt (R-AL5)",
		guard: func(n *attemptNote, op meetOp) bool {
			return n.Parked != nil && n.Parked.N > 0 && op.entry.chained() && int(op.entry.attempt) > n.Parked.N
		},
		apply: func(n *attemptNote, op meetOp) meetAct {
			act := n.claimParked(meetConnErr, entryOutcome{})
			n.Later = max(n.Later, int(op.entry.attempt))
			n.markRecorded(int(op.entry.attempt))
			act.chained = op.entry
			return act
		}},
	{ev: evEntry, when: "an entry for a later attempt than the parked one", next: "parked attempt recorded; the entry kept; Later = its attempt", rec: "connection_error for the parked attempt (Envoy retried it)",
		guard: func(n *attemptNote, op meetOp) bool {
			return n.Parked != nil && n.Parked.N > 0 && int(op.entry.attempt) > n.Parked.N
		},
		apply: func(n *attemptNote, op meetOp) meetAct {
			act := n.claimParked(meetConnErr, entryOutcome{})
			n.Later = max(n.Later, int(op.entry.attempt))
			n.addEntry(op.entry)
			return act
		}},
	{ev: evEntry, when: "a parked party that does not match", next: "unchanged", rec: "nothing (mismatch)",
		guard: func(n *attemptNote, _ meetOp) bool { return n.Parked != nil },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetMismatch} }},
	{ev: evEntry, when: "its attempt was recorded already", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *attemptNote, op meetOp) bool { return n.recordedAttempt(int(op.entry.attempt)) },
		apply: func(*attemptNote, meetOp) meetAct { return meetAct{how: meetDuplicate} }},
	{ev: evEntry, when: "NC/UH (no cluster) of a failover decision, nothing parked", next: "its attempt recorded; Later = its attempt", rec: "the entry, against the chain group of its attempt (R-AL5)",
		guard: func(_ *attemptNote, op meetOp) bool { return op.entry.chained() },
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.Later = max(n.Later, int(op.entry.attempt))
			n.markRecorded(int(op.entry.attempt))
			return meetAct{how: meetChained}
		}},
	{ev: evEntry, when: "otherwise (nothing parked yet)", next: "the entry kept (at most 4, the highest attempts); Later = its attempt", rec: "nothing yet",
		guard: always,
		apply: func(n *attemptNote, op meetOp) meetAct {
			n.addEntry(op.entry)
			if op.entry.attempt > 1 {
				n.Later = max(n.Later, int(op.entry.attempt))
			}
			return meetAct{how: meetEarly}
		}},
}

// step is the note's state machine: the next note and what to do. The
// note is a value: rows change their copy.
func step(cur attemptNote, op meetOp) (attemptNote, meetAct) {
	ev := op.event()
	if cur.Parked != nil {
		p := *cur.Parked
		cur.Parked = &p
	}
	for i := range noteTable {
		r := &noteTable[i]
		if r.ev == ev && r.guard(&cur, op) {
			act := r.apply(&cur, op)
			act.row = i
			if ev == evPark && op.park.N > 0 {
				// A park of attempt n says attempt n began: an earlier
				// attempt that parks later was retried.
				cur.Later = max(cur.Later, op.park.N)
			}
			return cur, act
		}
	}
	panic("unreachable: every event has an 'otherwise' row")
}

// renderNoteTable writes the table as docs/decisions.md holds it.
func renderNoteTable() string {
	var b strings.Builder
	b.WriteString("| # | event | when | note after | recorded |\n|---|---|---|---|---|\n")
	for i, r := range noteTable {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", i+1, r.ev, r.when, r.next, r.rec)
	}
	return b.String()
}
