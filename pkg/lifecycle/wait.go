package lifecycle

import (
	"fmt"
	"strings"
)

// The replica-local half of the lifecycle (SPEC R-DL13): where a party
// held on this replica is — a route-role decision on the replica that made
// it, or an attempt parked on the replica that served it — and what every
// event does to it, the store's answers to its note operations included.
// The note's table (table.go) says what the note does; this one says what
// the replica holding the party does with each answer. Its promises, which
// TestTwoReplicasStoreAnswers enumerates over channel orders × store
// answers on two replicas:
//   - an answer that is unknown (an error or a timeout: the operation may
//     or may not have run) is never read as "not applied": the park is
//     written again, off the request path, until the note answers (R-DL12);
//   - a wait that ends while the note never answered records its neither
//     and still writes the park, so a real outcome that reached the note
//     meanwhile, on any replica, is claimed from it (R-DL2: late);
//   - a claim made through the note records, whatever the local state: the
//     note's compare-and-set made it the one claim, and the record's key
//     turns away what another channel delivered too (R-DL11).

// Wait is where a party held on this replica is.
type Wait uint8

const (
	WaitLive     Wait = iota // the route role's stream runs (a decision only)
	WaitParking              // its stream ended with no outcome: the park is being written
	WaitNote                 // held here, parked in its note
	WaitAlone                // held here only: the note did not answer the park (or was full)
	WaitExpiring             // its wait ended: the note is asked to end the park
	WaitGone                 // its wait ended while alone: its neither is recorded, its park still being written
	WaitLate                 // its park reached the note after its wait ended: the note is asked to end it
	WaitDone                 // settled here: nothing more to do
)

var waitNames = [...]string{"live", "parking", "in note", "alone", "expiring", "gone", "late", "done"}

func (w Wait) String() string { return waitNames[w] }

// WaitEvent is what reached a held party.
type WaitEvent uint8

const (
	// WEnd: the route role's stream ended with no outcome; the park is
	// written next.
	WEnd WaitEvent = iota
	// WAnswer: the note answered a park of the party (the first one, a
	// repark, or a recheck's read); the Act's How is the answer.
	WAnswer
	// WExpire: the party's wait ended (its timer, on the server's clock).
	WExpire
	// WExpired: the note answered the expiry (How: HowNeither when it
	// still held the park).
	WExpired
	// WClaim: a channel on this replica claimed the party in the note.
	WClaim
	// WLocal: a channel on this replica met the party while the note did
	// not answer it (an entry, an arrival, the observer).
	WLocal
	// WGiveUp: the record's key life ended with the note never answering:
	// no outcome can arrive any more.
	WGiveUp
)

var waitEventNames = [...]string{"end", "answer", "expire", "expired", "claim", "local", "give up"}

func (e WaitEvent) String() string { return waitEventNames[e] }

// Rec is what the replica records for a held party.
type Rec uint8

const (
	RecNone    Rec = iota
	RecClaim       // the outcome the note's claim gave (an entry, a retried attempt)
	RecLocal       // the outcome that reached this replica (the note did not answer)
	RecNeither     // a neither that frees the party's probe slot
)

// WaitAct is what a held party's event does.
type WaitAct struct {
	Next Wait // (in the table, WaitLive means unchanged)
	Rec  Rec
	// Late: the party's neither was recorded here already (its slot was
	// freed): a real outcome is recorded without its lease (R-DL2).
	Late bool
	// Repark: write the park again after a while (reparkEvery).
	Repark bool
	// AskExpire: apply the expiry to the note now (or, after an unknown
	// answer, again after a while).
	AskExpire bool
	// Recheck: read the note again later (a decision held in its note).
	Recheck bool
	// Hold: the party is held here from now on (its wait's timer starts).
	Hold bool
	Row  int // the row that applied (tests)
}

// unknown: the note did not answer (HowUnreachable), or refused before it
// ran (HowFailed: its table full). Neither says "not applied" of a park
// that may have run, so both are written again.
func unknown(h How) bool { return h == HowUnreachable || h == HowFailed }

// claimed: the note's answer is the party's outcome (an early entry, or a
// later attempt that arrived first), for this replica to record.
func claimed(h How) bool { return h == HowEntry || h == HowConnErr }

type waitRow struct {
	from  []Wait // nil: any state
	ev    WaitEvent
	when  string
	guard func(How) bool
	act   WaitAct
	rec   string // what is done, in words (docs/decisions.md)
}

func anyHow(How) bool { return true }

func is(hs ...How) func(How) bool {
	return func(h How) bool {
		for _, x := range hs {
			if h == x {
				return true
			}
		}
		return false
	}
}

var waitTable = []waitRow{
	{from: []Wait{WaitLive}, ev: WEnd, when: "", guard: anyHow,
		act: WaitAct{Next: WaitParking}, rec: "the park is written (park, in the note's table)"},

	// The answer to the first park.
	{from: []Wait{WaitParking}, ev: WAnswer, when: "parked", guard: is(HowParked),
		act: WaitAct{Next: WaitNote, Hold: true, Recheck: true}, rec: "nothing yet: held until its wait ends; a decision reads its note again at 5 s, 30 s, 2 min"},
	{from: []Wait{WaitParking, WaitAlone}, ev: WAnswer, when: "an early entry or a later attempt claims it", guard: claimed,
		act: WaitAct{Next: WaitDone, Rec: RecClaim}, rec: "the outcome the note gave"},
	{from: []Wait{WaitParking, WaitAlone}, ev: WAnswer, when: "settled already (the observer, an entry, a replayed park)", guard: is(HowByObserver, HowDuplicate, HowMismatch),
		act: WaitAct{Next: WaitDone}, rec: "nothing: the channel that settled it recorded"},
	{from: []Wait{WaitParking}, ev: WAnswer, when: "unknown or refused (the note did not answer, or is full)", guard: unknown,
		act: WaitAct{Next: WaitAlone, Hold: true, Repark: true}, rec: "nothing yet: held here alone; the park is written again every 250 ms (R-DL12)"},

	// The answer to a repark of a party held here alone.
	{from: []Wait{WaitAlone}, ev: WAnswer, when: "parked (or parked already: the write whose answer was lost had run)", guard: is(HowParked, HowDuplicate),
		act: WaitAct{Next: WaitNote}, rec: "nothing yet: held in the note now"},
	{from: []Wait{WaitAlone, WaitGone}, ev: WAnswer, when: "unknown or refused", guard: unknown,
		act: WaitAct{Repark: true}, rec: "the park is written again"},

	// The answer to a repark after the wait ended alone.
	{from: []Wait{WaitGone}, ev: WAnswer, when: "parked, or parked already", guard: is(HowParked, HowDuplicate),
		act: WaitAct{Next: WaitLate, AskExpire: true}, rec: "the expiry is applied to the note (its neither is recorded already)"},
	{from: []Wait{WaitGone}, ev: WAnswer, when: "an early entry or a later attempt claims it", guard: claimed,
		act: WaitAct{Next: WaitDone, Rec: RecClaim, Late: true}, rec: "the outcome the note gave, late (without the slot)"},
	{from: []Wait{WaitGone}, ev: WAnswer, when: "settled already", guard: anyHow,
		act: WaitAct{Next: WaitDone}, rec: "nothing"},

	// A decision's read of its note (a recheck: a park of what is parked).
	{from: []Wait{WaitNote}, ev: WAnswer, when: "settled elsewhere (the observer, an entry on another replica)", guard: is(HowByObserver),
		act: WaitAct{Next: WaitDone}, rec: "nothing: let go (decision_events{recheck,settled_elsewhere})"},
	{from: []Wait{WaitNote}, ev: WAnswer, when: "an early entry claims it", guard: claimed,
		act: WaitAct{Next: WaitDone, Rec: RecClaim}, rec: "the outcome the note gave"},
	{from: []Wait{WaitNote}, ev: WAnswer, when: "still parked, or no answer", guard: anyHow,
		act: WaitAct{Recheck: true}, rec: "nothing: read again at the next recheck"},

	// The wait ends.
	{from: []Wait{WaitNote}, ev: WExpire, when: "", guard: anyHow,
		act: WaitAct{Next: WaitExpiring, AskExpire: true}, rec: "the expiry is applied to the note (expire, in the note's table)"},
	{from: []Wait{WaitAlone}, ev: WExpire, when: "", guard: anyHow,
		act: WaitAct{Next: WaitGone, Rec: RecNeither, Repark: true}, rec: "a neither that frees the slot; the park is still written, so a real outcome that reached the note is recorded late"},
	{from: []Wait{WaitExpiring}, ev: WExpired, when: "the note held the park", guard: is(HowNeither),
		act: WaitAct{Next: WaitDone, Rec: RecNeither}, rec: "a neither that frees the slot"},
	{from: []Wait{WaitExpiring, WaitLate}, ev: WExpired, when: "unknown", guard: is(HowUnreachable),
		act: WaitAct{AskExpire: true}, rec: "the expiry is applied again after 250 ms"},
	{from: []Wait{WaitExpiring, WaitLate}, ev: WExpired, when: "otherwise (claimed first, on any replica)", guard: anyHow,
		act: WaitAct{Next: WaitDone}, rec: "nothing: the claimer recorded"},

	// Claims and outcomes that reach this replica.
	{from: []Wait{WaitNote, WaitAlone, WaitExpiring, WaitGone, WaitLate, WaitDone}, ev: WClaim, when: "the observer on this replica claimed it", guard: is(HowObserved),
		act: WaitAct{Next: WaitDone}, rec: "nothing here: the observer records"},
	{from: []Wait{WaitGone, WaitLate}, ev: WClaim, when: "", guard: anyHow,
		act: WaitAct{Next: WaitDone, Rec: RecClaim, Late: true}, rec: "the claimed outcome, late (without the slot)"},
	{from: nil, ev: WClaim, when: "any other state, done included", guard: anyHow,
		act: WaitAct{Next: WaitDone, Rec: RecClaim}, rec: "the claimed outcome: the note's claim is the authority; the record's key turns away a repeat"},
	{from: []Wait{WaitGone, WaitLate}, ev: WLocal, when: "", guard: anyHow,
		act: WaitAct{Next: WaitDone, Rec: RecLocal, Late: true}, rec: "what reached this replica, late (without the slot)"},
	{from: []Wait{WaitNote, WaitAlone, WaitExpiring}, ev: WLocal, when: "", guard: anyHow,
		act: WaitAct{Next: WaitDone, Rec: RecLocal}, rec: "what reached this replica (keyed: a claim elsewhere of the same outcome is a repeat)"},
	{from: []Wait{WaitGone}, ev: WGiveUp, when: "", guard: anyHow,
		act: WaitAct{Next: WaitDone}, rec: "nothing: no outcome can come any more"},
}

// WaitStep is the replica-local machine: what ev, with the note's answer
// how (WAnswer, WExpired), does to a party in state w. An event no row
// names for w changes nothing.
func WaitStep(w Wait, ev WaitEvent, how How) WaitAct {
	for i := range waitTable {
		r := &waitTable[i]
		if r.ev != ev || !r.guard(how) || r.from != nil && !hasWait(r.from, w) {
			continue
		}
		act := r.act
		if act.Next == WaitLive {
			act.Next = w // no row goes back to live: the zero Next is "unchanged"
		}
		act.Row = i
		return act
	}
	return WaitAct{Next: w, Row: -1}
}

func hasWait(ws []Wait, w Wait) bool {
	for _, x := range ws {
		if x == w {
			return true
		}
	}
	return false
}

// RenderWaitTable writes the replica-local table as docs/decisions.md
// holds it.
func RenderWaitTable() string {
	var b strings.Builder
	b.WriteString("| # | state | event | when (the note's answer) | next | done here |\n|---|---|---|---|---|---|\n")
	for i, r := range waitTable {
		from := "any"
		if r.from != nil {
			names := make([]string, len(r.from))
			for j, w := range r.from {
				names[j] = w.String()
			}
			from = strings.Join(names, ", ")
		}
		next := "unchanged"
		if r.act.Next != WaitLive {
			next = r.act.Next.String()
		}
		when := r.when
		if when == "" {
			when = "—"
		}
		fmt.Fprintf(&b, "| W%d | %s | %s | %s | %s | %s |\n", i+1, from, r.ev, when, next, r.rec)
	}
	return b.String()
}
