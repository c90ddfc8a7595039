package lifecycle

import (
	"fmt"
	"strings"
)

// The lifecycle of a decision's note (SPEC §4b, R-DL1, R-DL2): one table of
// transitions that every channel drives — the route role's stream end
// (park 0), an attempt that ended before headers (park n), the park's end
// (expire), the next attempt's arrival, an access log entry, and the
// observer. docs/decisions.md is this table written out (RenderTable;
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

// Event is what reached a decision's note.
type Event uint8

const (
	EvPark Event = iota
	EvExpire
	EvArrive
	EvEntry
	EvObserve
)

var noteEventNames = [...]string{"park", "expire", "arrive", "entry", "observe"}

func (e Event) String() string { return noteEventNames[e] }

func (op Op) Event() Event {
	switch {
	case op.Observe:
		return EvObserve
	case op.Expire:
		return EvExpire
	case op.Park != nil:
		return EvPark
	case op.Arrive > 0:
		return EvArrive
	}
	return EvEntry
}

// row is one transition.
type row struct {
	ev    Event
	when  string // the guard, in words (docs/decisions.md)
	next  string // the note after it, in words
	rec   string // what is recorded, in words
	guard func(n *Note, op Op) bool
	apply func(n *Note, op Op) Act
}

func always(*Note, Op) bool { return true }

// recordedAttempt reports whether attempt n's outcome was recorded through
// the note (one record per attempt number, R-DL4).
func (n *Note) recordedAttempt(a int) bool {
	return a >= 1 && a <= 63 && n.Rec&(1<<a) != 0
}

func (n *Note) markRecorded(a int) {
	if a >= 1 && a <= 63 {
		n.Rec |= 1 << a
	}
}

func (n *Note) markArrived(a int) {
	if a >= 1 && a <= 63 {
		n.Arr |= 1 << a
	}
}

// settled: the decision's own outcome (N 0) is recorded, by an entry, the
// observer, or the route role itself.
func (n *Note) settled() bool { return n.Done || n.Obs }

// claimParked takes the parked party out of the note as the one to record.
func (n *Note) claimParked(how How, res Entry) Act {
	q := n.Parked
	act := Act{How: how, Claim: q, Res: res, Late: n.Expired}
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
func (n *Note) matchingEntry(p *Park) int {
	if n.Entry != nil && n.Entry.Outcome().Matches(p) {
		return 0
	}
	for i := range n.More {
		if n.More[i].Outcome().Matches(p) {
			return i + 1
		}
	}
	return -1
}

// takeEntry removes and returns early entry i (matchingEntry's index).
func (n *Note) takeEntry(i int) Entry {
	if i == 0 {
		out := n.Entry.Outcome()
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
	out := n.More[i-1].Outcome()
	n.More = append(n.More[:i-1:i-1], n.More[i:]...)
	if len(n.More) == 0 {
		n.More = nil
	}
	return out
}

// addEntry keeps an early entry, unless one like it is kept or the note
// holds maxEarlyEntries already.
func (n *Note) addEntry(o *Entry) {
	e := EntryNote{Res: o.Res, Cluster: o.Cluster, Attempt: o.Attempt}
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
		n.More = append(append([]EntryNote(nil), n.More...), e)
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
	n.More = append([]EntryNote(nil), n.More...)
	if low < 0 {
		n.Entry = &e
	} else {
		n.More[low] = e
	}
}

var noteTable = []row{
	// The observer (observe.go): one observer record per decision.
	{ev: EvObserve, when: "the decision is settled (observed, or recorded from an entry)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *Note, _ Op) bool { return n.settled() },
		apply: func(*Note, Op) Act { return Act{How: HowDuplicate} }},
	{ev: EvObserve, when: "the route role's decision waits (parked N 0, or its wait ended)", next: "observed", rec: "the observer records (late, without the slot, after the wait ended)",
		guard: func(n *Note, _ Op) bool { return n.Parked != nil && n.Parked.N == 0 },
		apply: func(n *Note, _ Op) Act {
			act := n.claimParked(HowObserved, Entry{})
			n.Obs = true
			return act
		}},
	{ev: EvObserve, when: "an attempt is parked (the failover deployment has no observer)", next: "unchanged", rec: "nothing (mismatch)",
		guard: func(n *Note, _ Op) bool { return n.Parked != nil },
		apply: func(*Note, Op) Act { return Act{How: HowMismatch} }},
	{ev: EvObserve, when: "otherwise (the observer came first; an early entry is dropped)", next: "observed", rec: "the observer records",
		guard: always,
		apply: func(n *Note, _ Op) Act {
			n.Obs, n.Entry = true, nil
			return Act{How: HowObserveFirst}
		}},

	// The route role's stream ended with no response (park N 0).
	{ev: EvPark, when: "N 0, the decision is settled", next: "settled (the park seen)", rec: "nothing (the observer or an entry records)",
		guard: func(n *Note, op Op) bool { return op.Park.N == 0 && n.settled() },
		apply: func(n *Note, _ Op) Act {
			n.Done = true
			return Act{How: HowByObserver}
		}},
	{ev: EvPark, when: "N 0, an early entry matches", next: "settled", rec: "the entry's outcome",
		guard: func(n *Note, op Op) bool { return op.Park.N == 0 && n.matchingEntry(op.Park) >= 0 },
		apply: func(n *Note, op Op) Act {
			out := n.takeEntry(n.matchingEntry(op.Park))
			n.Entry, n.More, n.Done = nil, nil, true
			return Act{How: HowEntry, Claim: op.Park, Res: out}
		}},
	{ev: EvPark, when: "N 0, parked already (waiting or expired)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *Note, op Op) bool { return op.Park.N == 0 && n.Parked != nil && n.Parked.N == 0 },
		apply: func(*Note, Op) Act { return Act{How: HowDuplicate} }},
	{ev: EvPark, when: "N 0, otherwise", next: "parked N 0", rec: "nothing yet (waits decision_wait_sec or access_log.wait_ms)",
		guard: func(_ *Note, op Op) bool { return op.Park.N == 0 },
		apply: func(n *Note, op Op) Act {
			n.Parked, n.Expired = op.Park, false
			return Act{How: HowParked}
		}},

	// An attempt ended before response headers (park n ≥ 1).
	{ev: EvPark, when: "attempt n was recorded already (a replayed token)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *Note, op Op) bool { return n.recordedAttempt(op.Park.N) },
		apply: func(*Note, Op) Act { return Act{How: HowDuplicate} }},
	{ev: EvPark, when: "attempt n is parked already, waiting or expired (a replayed park)", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *Note, op Op) bool { return n.Parked != nil && n.Parked.N == op.Park.N },
		apply: func(*Note, Op) Act { return Act{How: HowDuplicate} }},
	{ev: EvPark, when: "a later attempt arrived already (Later > n)", next: "attempt n recorded; Later kept", rec: "connection_error for attempt n",
		guard: func(n *Note, op Op) bool { return n.Later > op.Park.N },
		apply: func(n *Note, op Op) Act {
			n.markRecorded(op.Park.N)
			return Act{How: HowConnErr, Claim: op.Park}
		}},
	{ev: EvPark, when: "an early entry names attempt n (or no attempt) and its cluster", next: "attempt n recorded", rec: "the entry's outcome",
		guard: func(n *Note, op Op) bool { return n.matchingEntry(op.Park) >= 0 },
		apply: func(n *Note, op Op) Act {
			out := n.takeEntry(n.matchingEntry(op.Park))
			n.markRecorded(op.Park.N)
			return Act{How: HowEntry, Claim: op.Park, Res: out}
		}},
	{ev: EvPark, when: "a later attempt is parked already", next: "unchanged; attempt n recorded", rec: "connection_error for attempt n (Envoy retried it)",
		guard: func(n *Note, op Op) bool { return n.Parked != nil && n.Parked.N > op.Park.N },
		apply: func(n *Note, op Op) Act {
			n.markRecorded(op.Park.N)
			return Act{How: HowConnErr, Claim: op.Park}
		}},
	{ev: EvPark, when: "otherwise", next: "parked n (an earlier parked attempt is claimed)", rec: "nothing yet for n; connection_error for the earlier one",
		guard: always,
		apply: func(n *Note, op Op) Act {
			act := Act{How: HowParked}
			if q := n.Parked; q != nil && q.N < op.Park.N && q.N > 0 {
				act.Older, act.OlderLate = q, n.Expired
				n.markRecorded(q.N)
			}
			n.Parked, n.Expired = op.Park, false
			return act
		}},

	// The park's time ended.
	{ev: EvExpire, when: "its own park waits", next: "expired (kept for a late outcome)", rec: "a neither that frees its probe slot",
		guard: func(n *Note, op Op) bool { return n.Parked != nil && !n.Expired && *n.Parked == *op.Park },
		apply: func(n *Note, op Op) Act {
			n.Expired = true
			return Act{How: HowNeither, Claim: op.Park}
		}},
	{ev: EvExpire, when: "otherwise (claimed, or another park since)", next: "unchanged", rec: "nothing",
		guard: always, apply: func(*Note, Op) Act { return Act{} }},

	// Attempt n of the request began.
	{ev: EvArrive, when: "attempt n arrived already (a replayed token)", next: "unchanged", rec: "nothing: the replay's attempt records nothing (duplicate)",
		guard: func(n *Note, op Op) bool { return op.Arrive <= 63 && n.Arr&(1<<op.Arrive) != 0 },
		apply: func(*Note, Op) Act { return Act{How: HowDuplicate} }},
	{ev: EvArrive, when: "an earlier attempt is parked", next: "attempt recorded; Later = max(Later, n)", rec: "connection_error for the parked attempt",
		guard: func(n *Note, op Op) bool {
			return n.Parked != nil && n.Parked.N > 0 && n.Parked.N < op.Arrive
		},
		apply: func(n *Note, op Op) Act {
			act := n.claimParked(HowConnErr, Entry{})
			n.Later = max(n.Later, op.Arrive)
			n.markArrived(op.Arrive)
			return act
		}},
	{ev: EvArrive, when: "otherwise", next: "Later = max(Later, n)", rec: "nothing",
		guard: always,
		apply: func(n *Note, op Op) Act {
			n.Later = max(n.Later, op.Arrive)
			n.markArrived(op.Arrive)
			return Act{}
		}},

	// Envoy's access log entry (R-AL3, R-AL5).
	{ev: EvEntry, when: "the decision is settled", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *Note, _ Op) bool { return n.settled() },
		apply: func(*Note, Op) Act { return Act{How: HowByObserver} }},
	{ev: EvEntry, when: "a parked party matches (its attempt, or any for N 0; its cluster, or none named)", next: "its attempt recorded", rec: "the entry's outcome (late, without the slot, after the park ended)",
		guard: func(n *Note, op Op) bool { return n.Parked != nil && op.Entry.Matches(n.Parked) },
		apply: func(n *Note, op Op) Act { return n.claimParked(HowEntry, *op.Entry) }},
	{ev: EvEntry, when: "NC/UH (no cluster) for a later attempt than the parked one", next: "parked attempt recorded; Later = the entry's attempt", rec: "connection_error for the parked attempt; the entry for its own attempt (R-AL5)",
		guard: func(n *Note, op Op) bool {
			return n.Parked != nil && n.Parked.N > 0 && op.Entry.Chained && int(op.Entry.Attempt) > n.Parked.N
		},
		apply: func(n *Note, op Op) Act {
			act := n.claimParked(HowConnErr, Entry{})
			n.Later = max(n.Later, int(op.Entry.Attempt))
			n.markRecorded(int(op.Entry.Attempt))
			act.Chained = op.Entry
			return act
		}},
	{ev: EvEntry, when: "an entry for a later attempt than the parked one", next: "parked attempt recorded; the entry kept; Later = its attempt", rec: "connection_error for the parked attempt (Envoy retried it)",
		guard: func(n *Note, op Op) bool {
			return n.Parked != nil && n.Parked.N > 0 && int(op.Entry.Attempt) > n.Parked.N
		},
		apply: func(n *Note, op Op) Act {
			act := n.claimParked(HowConnErr, Entry{})
			n.Later = max(n.Later, int(op.Entry.Attempt))
			n.addEntry(op.Entry)
			return act
		}},
	{ev: EvEntry, when: "a parked party that does not match", next: "unchanged", rec: "nothing (mismatch)",
		guard: func(n *Note, _ Op) bool { return n.Parked != nil },
		apply: func(*Note, Op) Act { return Act{How: HowMismatch} }},
	{ev: EvEntry, when: "its attempt was recorded already", next: "unchanged", rec: "nothing (duplicate)",
		guard: func(n *Note, op Op) bool { return n.recordedAttempt(int(op.Entry.Attempt)) },
		apply: func(*Note, Op) Act { return Act{How: HowDuplicate} }},
	{ev: EvEntry, when: "NC/UH (no cluster) of a failover decision, nothing parked", next: "its attempt recorded; Later = its attempt", rec: "the entry, against the chain group of its attempt (R-AL5)",
		guard: func(_ *Note, op Op) bool { return op.Entry.Chained },
		apply: func(n *Note, op Op) Act {
			n.Later = max(n.Later, int(op.Entry.Attempt))
			n.markRecorded(int(op.Entry.Attempt))
			return Act{How: HowChained}
		}},
	{ev: EvEntry, when: "otherwise (nothing parked yet)", next: "the entry kept (at most 4, the highest attempts); Later = its attempt", rec: "nothing yet",
		guard: always,
		apply: func(n *Note, op Op) Act {
			n.addEntry(op.Entry)
			if op.Entry.Attempt > 1 {
				n.Later = max(n.Later, int(op.Entry.Attempt))
			}
			return Act{How: HowEarly}
		}},
}

// step is the note's state machine: the next note and what to do. The
// note is a value: rows change their copy.
func Step(cur Note, op Op) (Note, Act) {
	ev := op.Event()
	if op.ID != "" {
		for _, c := range cur.Claims {
			if c.ID == op.ID {
				return cur, c.act(op)
			}
		}
	}
	if cur.Parked != nil {
		p := *cur.Parked
		cur.Parked = &p
	}
	for i := range noteTable {
		r := &noteTable[i]
		if r.ev == ev && r.guard(&cur, op) {
			act := r.apply(&cur, op)
			act.Row = i
			if ev == EvPark && op.Park.N > 0 {
				// A park of attempt n says attempt n began: an earlier
				// attempt that parks later was retried.
				cur.Later = max(cur.Later, op.Park.N)
			}
			if op.ID != "" && act.claims() {
				cur.remember(op.ID, act)
			}
			return cur, act
		}
	}
	panic("unreachable: every event has an 'otherwise' row")
}

// remember keeps what the note answered operation id, the latest
// maxClaims.
func (n *Note) remember(id string, act Act) {
	c := Claim{ID: id, How: act.How, Claim: act.Claim, Late: act.Late, Older: act.Older, OlderLate: act.OlderLate, Chained: act.Chained != nil,
		Res: EntryNote{Res: act.Res.Res, Cluster: act.Res.Cluster, Attempt: act.Res.Attempt}}
	keep := n.Claims
	if len(keep) >= maxClaims {
		keep = keep[len(keep)-maxClaims+1:]
	}
	n.Claims = append(append([]Claim(nil), keep...), c)
}

// act is the answer a claim gave, given again to the operation op that
// made it.
func (c *Claim) act(op Op) Act {
	a := Act{How: c.How, Claim: c.Claim, Res: c.Res.Outcome(), Late: c.Late, Older: c.Older, OlderLate: c.OlderLate, Again: true, Row: -1}
	if c.Chained {
		a.Chained = op.Entry
	}
	return a
}

// RenderTable writes the table as docs/decisions.md holds it.
func RenderTable() string {
	var b strings.Builder
	b.WriteString("| # | event | when | note after | recorded |\n|---|---|---|---|---|\n")
	for i, r := range noteTable {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", i+1, r.ev, r.when, r.next, r.rec)
	}
	return b.String()
}
