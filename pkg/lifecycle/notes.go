package lifecycle

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Notes runs operations on decisions' notes in the store, for one
// replica: each by compare-and-set from a guess (Run), only on a note that
// exists (RunExisting), or again, off the request path, until the note
// answers (Resend); and it keeps the replica's budget of notes made for
// entries that name no decision it holds (EarlyAllowed). It is the only
// code that reads or writes a note; the processor's roles call it with the
// events their channels bring.
type Notes struct {
	Store breaker.Store
	Clock breaker.Clock
	// Waits returns the loaded config's decision_wait and
	// access_log.wait_ms (zero before a config is loaded).
	Waits func() (decision, accessLog time.Duration)
	// Count tells fusebox_decision_events_total{event,result} one more.
	Count func(event, result string)
	// Internal counts an internal error (fusebox_internal_errors_total).
	Internal func(where string)
	// AfterFunc arms the resends' timers; nil = breaker.AfterFunc on
	// Clock. The processor's ends with it: a resend runs until the
	// record key's life ends (10 minutes or more), and one armed on a
	// stopped fusebox kept it, its store and its tables, alive that long
	// (#54: the fleet soak held 4 of 9 restarted fuseboxes).
	AfterFunc func(d time.Duration, f func()) breaker.Timer

	mu sync.Mutex
	// early counts the early-entry notes made since earlyFrom (R-DL5).
	early     int
	earlyFrom int64
	// resending counts the operations being sent again (MaxResends).
	resending int
}

// ParkFor is how long a parked attempt waits for its request's next
// attempt or its access log entry before it is a neither (R-O8), and how
// long a note that waits for nothing else lives.
const ParkFor = 5 * time.Second

// claimsLife is how long a note that made claims for operations with an
// id lives (lifecycle.Note.Claims): a blip, a failover, a fork's pause.
const claimsLife = time.Minute

// NoteName is the store's name of decision's note.
func NoteName(decision string) string { return "a:" + decision }

// Run applies op to decision's note by compare-and-set, starting from the
// guess prev (nil: no note), and returns what it did. A store that errs
// reports HowUnreachable, never a swap on a private table (R-DL7).
func (n *Notes) Run(decision string, prev []byte, op Op) Act {
	var cur Note
	if prev != nil {
		_ = Decode(prev, &cur)
	}
	for range 5 {
		next, act := Step(cur, op)
		raw := next.Encode()
		got, ok, err := n.Store.SwapNote(context.Background(), NoteName(decision), prev, raw, n.ttl(next))
		if err != nil {
			if errors.Is(err, breaker.ErrNotesFull) {
				return Act{How: HowFailed}
			}
			n.Count(op.Event().String(), "meet_unreachable")
			return Act{How: HowUnreachable}
		}
		if ok {
			n.count(op.Event(), act)
			return act
		}
		prev, cur = got, Note{}
		if got != nil && Decode(got, &cur) != nil {
			cur = Note{} // not ours: overwritten by the next try
		}
	}
	n.Internal("attempt_note")
	return Act{How: HowFailed}
}

// ttl: a note lives past the longest wait of what it holds. Only two
// states wait for a response: a route-role decision (N 0) parked and not
// yet expired, and an observer that came before the route role's park (on
// Envoy 1.36 the route role's stream ends with the response); they live
// decision_wait_sec. Anything else lives a park time: long enough for a
// late or duplicate event to find it. (Every observed decision's note
// living decision_wait_sec would hold 300 s of traffic in the store.)
func (n *Notes) ttl(note Note) time.Duration {
	waiting := note.Parked != nil && note.Parked.N == 0 && !note.Expired
	if waiting || note.Obs && !note.Done {
		dw, _ := n.Waits()
		return max(dw, ParkFor) + time.Second
	}
	if len(note.Claims) > 0 {
		// An operation whose answer was lost is sent again for as long as
		// the store stays away: its claim must still be there to answer it.
		return claimsLife
	}
	return ParkFor + time.Second
}

// count tells fusebox_decision_events_total what an event became.
func (n *Notes) count(ev Event, act Act) {
	var r string
	switch act.How {
	case HowDuplicate, HowByObserver:
		r = "duplicate"
	case HowMismatch:
		r = "mismatch"
	case HowConnErr, HowEntry, HowObserved, HowObserveFirst:
		r = "recorded"
		if act.Late {
			r = "late"
		}
	default:
		return
	}
	n.Count(ev.String(), r)
}

// RunExisting applies op only to a note that exists (it creates none).
func (n *Notes) RunExisting(decision string, op Op) Act {
	got, ok, err := n.Store.SwapNote(context.Background(), NoteName(decision), nil, nil, time.Second)
	if err != nil || ok || got == nil {
		// ok: there was no note (deleting nothing succeeded).
		return Act{}
	}
	return n.Run(decision, got, op)
}

// maxResends bounds the operations a replica sends again at once (an
// entry or an arrival whose answer was unknown); past it they are dropped
// and counted (decision_events{result="resend_dropped"}).
const MaxResends = 8192

// ResendEvery is how often an operation whose answer was unknown (a
// park, an entry, an arrival) is sent again at first.
const ResendEvery = 250 * time.Millisecond

// Resend sends op again, off the request path, every ResendEvery (up to
// 5 s apart) until the note answers or the record key's life ends, and
// hands the answer to then (R-DL12). An unknown answer is never read as
// "not applied": the note may have taken the operation and claimed a
// party with it, which only its answer to the same id says.
func (n *Notes) Resend(decision, event string, op Op, then func(Act)) {
	n.mu.Lock()
	if n.resending >= MaxResends {
		n.mu.Unlock()
		n.Count(event, "resend_dropped")
		return
	}
	n.resending++
	n.mu.Unlock()
	n.Count(event, "resent")
	life := RecordKeyLife(n.Waits())
	until := n.Clock.Now().Add(life)
	every := ResendEvery
	var try func()
	try = func() {
		act := n.Run(decision, nil, op)
		if Unknown(act.How) && n.Clock.Now().Before(until) {
			every = min(2*every, 5*time.Second)
			n.after(every, try)
			return
		}
		n.mu.Lock()
		n.resending--
		n.mu.Unlock()
		if !Unknown(act.How) {
			then(act)
		}
	}
	n.after(every, try)
}

func (n *Notes) after(d time.Duration, f func()) {
	if n.AfterFunc != nil {
		n.AfterFunc(d, f)
		return
	}
	breaker.AfterFunc(n.Clock, d, f)
}

// MaxEarly bounds the notes this replica creates for entries that name no
// decision it knows, per park time (R-DL5): such an entry may be early (the
// decision's stream ends on another replica soon), or forged, or a flood
// of random ids. Past the bound they are dropped and counted, so they never
// fill the note table that real decisions and parked attempts wait in (on
// memory 2^17 notes; on Redis, keys).
const MaxEarly = 8192

// EarlyAllowed takes one of this park time's early-entry notes.
func (n *Notes) EarlyAllowed() bool {
	now := n.Clock.Now().UnixNano()
	n.mu.Lock()
	defer n.mu.Unlock()
	if now-n.earlyFrom >= int64(ParkFor) {
		n.earlyFrom, n.early = now, 0
	}
	if n.early >= MaxEarly {
		return false
	}
	n.early++
	return true
}

// Unknown says the note did not answer (the operation may or may not have
// run), or refused it before it ran (its table full): either way it is sent
// again (R-DL12), and only its answer to the same id says what it did.
func Unknown(h How) bool {
	return h == HowUnreachable || h == HowFailed
}
