package lifecycle

import (
	"fmt"
	"strings"
	"testing"
)

// TestTwoReplicasStoreAnswers enumerates, for each deployment, every order
// of its channels' events spread over two replicas, times every answer the
// store can give each call (SPEC R-DL13): applied, not applied (refused
// before it ran), unknown and applied (the reply was lost after the script
// ran), unknown and not applied. Both tables drive it: the note's (Step),
// through a compare-and-set on one shared note, and the replica-local one
// (WaitStep) for every party a replica holds. A harness plays what each
// channel of the processor does with the answers (meet.go, accesslog.go,
// observe.go): an unknown answer is sent again later (R-DL12), records are
// keyed (R-DL11) and the store applies a key once.
//
// The checker has no slack (R-DL14): exactly one applied record for each
// party that had a real outcome, none for one that had not, and at most one
// neither per party.
func TestTwoReplicasStoreAnswers(t *testing.T) {
	total := 0
	for _, d := range replicaDeployments() {
		n := 0
		bad := 0
		explore(newWorld(d), func(w *world) {
			n++
			if msg := w.check(d); msg != "" {
				if bad++; bad <= 3 {
					t.Error(msg)
				}
			}
		})
		if bad > 0 {
			t.Errorf("%s: %d of %d histories broke a promise", d.name, bad, n)
		}
		total += n
		t.Logf("%s: %d histories", d.name, n)
	}
	if total < 100000 {
		t.Fatalf("only %d histories enumerated", total)
	}
	t.Logf("%d histories in all", total)
}

// faultBudget bounds the answers other than "applied" in one history: every
// one of them is tried at every store call, so each history meets up to
// this many faults, anywhere.
const faultBudget = 2

type answer uint8

const (
	ansApplied    answer = iota
	ansRefused           // not applied, and said so (a full table)
	ansLostAfter         // applied, the reply lost: unknown
	ansLostBefore        // not applied, the call failed: unknown
	nAnswers
)

var answerNames = [...]string{"ok", "refused", "lost-after", "lost-before"}

// evKind is a channel's event, or a replica's own timer.
type evKind uint8

const (
	evEnd       evKind = iota // the route role's stream ends with no response (the decision's replica)
	evPark                    // attempt n ends before headers (the replica that served it)
	evEntry                   // Envoy's access log entry for attempt n (0: the decision)
	evObserve                 // the observer sees the response begin
	evArrive                  // attempt n begins (a retry of n-1)
	evExpire                  // a held party's wait ends
	evRepark                  // a held party's park is written again
	evAskExpire               // a held party's expiry is applied again
	evRecheck                 // a held decision reads its note
	evResend                  // a note operation whose answer was unknown is sent again
	evRecord                  // a keyed record whose answer was unknown is sent again
)

var evNames = [...]string{"end", "park", "entry", "observe", "arrive", "expire", "repark", "askexpire", "recheck", "resend", "record"}

type event struct {
	kind evKind
	rep  int // replica 0 (A) or 1 (B)
	n    int // the party (attempt number; 0 the decision)
	op   Op  // evResend: the operation
}

func (e event) String() string {
	return fmt.Sprintf("%s%d@%c", evNames[e.kind], e.n, 'A'+e.rep)
}

// replicaDeployment is a world: the events its channels bring, and which
// parties have a real outcome among them.
type replicaDeployment struct {
	name     string
	observer bool // the observer profile (an entry kept while live parks)
	parks    map[int]*Park
	events   []event
	real     map[int]bool
}

func replicaDeployments() []replicaDeployment {
	var out []replicaDeployment
	// The route profile: the decision is made on A; its stream ends with no
	// response; Envoy's entry (or none) reaches A or B.
	for _, at := range []int{-1, 0, 1} {
		d := replicaDeployment{name: fmt.Sprintf("route entry@%s", where(at)), parks: map[int]*Park{0: {Gateway: "g", Route: "r", Cluster: "c"}},
			real: map[int]bool{}}
		d.events = append(d.events, event{kind: evEnd})
		if at >= 0 {
			d.events = append(d.events, event{kind: evEntry, rep: at})
			d.real[0] = true
		}
		out = append(out, d)
	}
	// The observer profile: the observer sees the response on A or B; an
	// entry may come too.
	for _, obs := range []int{0, 1} {
		for _, at := range []int{-1, 0, 1} {
			d := replicaDeployment{name: fmt.Sprintf("observer observe@%s entry@%s", where(obs), where(at)), observer: true,
				parks: map[int]*Park{0: {Gateway: "g", Route: "r", Cluster: "c"}}, real: map[int]bool{0: true}}
			d.events = append(d.events, event{kind: evEnd}, event{kind: evObserve, rep: obs})
			if at >= 0 {
				d.events = append(d.events, event{kind: evEntry, rep: at})
			}
			out = append(out, d)
		}
	}
	// Failover: attempt 1 served on A ends before headers; Envoy retries
	// it (attempt 2 arrives on A or B), or writes its entry, or neither.
	for _, arr := range []int{-1, 0, 1} {
		for _, at := range []int{-1, 0, 1} {
			d := replicaDeployment{name: fmt.Sprintf("failover arrive2@%s entry@%s", where(arr), where(at)),
				parks: map[int]*Park{1: {N: 1, Gateway: "g", Route: "r1", Cluster: "c1", RouteGen: 1}}, real: map[int]bool{}}
			d.events = append(d.events, event{kind: evPark, n: 1})
			last := 1
			if arr >= 0 {
				d.events = append(d.events, event{kind: evArrive, rep: arr, n: 2})
				d.real[1] = true
				last = 2
			}
			if at >= 0 {
				if last == 2 {
					// Attempt 2 ended before headers too, on the replica it
					// arrived at, and its entry came.
					d.parks[2] = &Park{N: 2, Gateway: "g", Route: "r2", Cluster: "c2", RouteGen: 2}
					d.events = append(d.events, event{kind: evPark, rep: arr, n: 2})
				}
				d.events = append(d.events, event{kind: evEntry, rep: at, n: last})
				d.real[last] = true
			}
			out = append(out, d)
		}
	}
	return out
}

func where(rep int) string {
	if rep < 0 {
		return "none"
	}
	return string(rune('A' + rep))
}

// held is a party a replica holds.
type held struct {
	w        Wait
	late     bool   // its neither was recorded here
	kept     *Entry // an entry that reached the decision's replica while live
	rechecks int
	// unanswered: its park's answer was unknown: the park is sent again
	// until answered, whatever its state (the answer may name an earlier
	// attempt the park claimed).
	unanswered bool
}

type world struct {
	d     *replicaDeployment
	note  *Note          // nil: none (a value: Step never changes a note in place)
	keys  [maxParty]bool // keys the store applied, by party (a repeat answers already_applied)
	neith [maxParty]int
	held  [2][maxParty]*held
	pool  []event
	hist  *histNode

	// the answers of this history's store calls, and the cursor
	choices []answer
	at      int
	faults  int
}

func newWorld(d replicaDeployment) *world {
	w := &world{d: &d}
	w.pool = append([]event(nil), d.events...)
	return w
}

func (w *world) clone() *world {
	c := *w
	for i := range w.held {
		for k, v := range w.held[i] {
			if v != nil {
				h := *v
				c.held[i][k] = &h
			}
		}
	}
	c.pool = append([]event(nil), w.pool...)
	c.choices = nil
	c.at = 0
	return &c
}

// maxParty bounds the parties of a deployment: the decision and two
// attempts.
const maxParty = 3

// answer is the store's answer to the next call of this event.
func (w *world) answer() answer {
	if w.at >= len(w.choices) {
		w.choices = append(w.choices, ansApplied)
	}
	a := w.choices[w.at]
	w.at++
	return a
}

// explore runs every enabled event of the pool, with every sequence of
// answers within the fault budget, and calls done at each history's end.
func explore(w *world, done func(*world)) {
	if len(w.pool) == 0 {
		done(w)
		return
	}
	for i := range w.pool {
		if !w.enabled(w.pool[i]) {
			continue
		}
		var choices []answer
		for {
			c := w.clone()
			c.choices = append([]answer(nil), choices...)
			e := c.pool[i]
			c.pool = append(c.pool[:i:i], c.pool[i+1:]...)
			c.run(e)
			used := c.choices[:c.at]
			explore(c, done)
			// The next sequence of answers: the last call that can take
			// another answer within the budget; the calls after it start
			// again at "applied".
			next := -1
			for j := len(used) - 1; j >= 0 && next < 0; j-- {
				if used[j]+1 >= nAnswers {
					continue
				}
				f := w.faults
				for _, a := range used[:j] {
					if a != ansApplied {
						f++
					}
				}
				if f+1 <= faultBudget {
					next = j
				}
			}
			if next < 0 {
				break
			}
			choices = append(append([]answer(nil), used[:next]...), used[next]+1)
		}
	}
}

// enabled: an event may happen now. A party's own events wait for it to be
// held; an entry or an arrival may come before anything else (Envoy's
// streams are separate); the decision's stream ends before its observer
// sees the response (the route role's reply went first).
func (w *world) enabled(e event) bool {
	switch e.kind {
	case evObserve:
		return w.ended(0)
	case evPark:
		if e.n > 1 {
			return w.seen(evArrive, e.n) // attempt n began before it ended
		}
	}
	return true
}

func (w *world) ended(n int) bool {
	for _, e := range w.pool {
		if e.kind == evEnd && e.n == n {
			return false
		}
	}
	return true
}

func (w *world) seen(k evKind, n int) bool {
	for _, e := range w.pool {
		if e.kind == k && e.n == n {
			return false
		}
	}
	return true
}

// swap runs op through the note's table by compare-and-set, as meet.go's
// run does, with the store's next answer.
func (w *world) swap(op Op) Act {
	var cur Note
	if w.note != nil {
		cur = *w.note
	}
	next, act := Step(cur, op)
	a := w.answer()
	if a != ansApplied {
		w.faults++
	}
	w.log(histItem{what: 's', ev: uint8(op.Event()), ans: a})
	switch a {
	case ansRefused:
		return Act{How: HowFailed}
	case ansLostBefore:
		return Act{How: HowUnreachable}
	}
	w.note = &next
	if next.empty() {
		w.note = nil
	}
	if a == ansLostAfter {
		return Act{How: HowUnreachable}
	}
	return act
}

// existing runs op only on a note that exists (meet.go runExisting).
func (w *world) existing(op Op) Act {
	if w.note == nil {
		return Act{}
	}
	return w.swap(op)
}

// A record's key is its decision and attempt (R-DL11): the decision
// itself (party 0) is attempt 1.

// record sends a party's real outcome, keyed.
func (w *world) record(n int) {
	a := w.answer()
	if a != ansApplied {
		w.faults++
	}
	w.log(histItem{what: 'r', n: n, ans: a})
	switch a {
	case ansApplied, ansLostAfter:
		w.keys[max(n, 1)] = true
	}
	if a != ansApplied {
		// Unknown (or refused): sent again, with the same key.
		w.pool = append(w.pool, event{kind: evRecord, n: n})
	}
}

func (w *world) neither(n int) {
	w.neith[n]++
	w.log(histItem{what: 'n', n: n})
}

// step applies a replica-local event to the party rep holds and does what
// the table says.
func (w *world) step(rep, n int, ev WaitEvent, how How) {
	h := w.held[rep][n]
	if h == nil {
		return
	}
	act := WaitStep(h.w, ev, how)
	w.log(histItem{what: 'w', n: act.Row + 1})
	h.w = act.Next
	h.late = h.late || act.Rec == RecNeither
	switch act.Rec {
	case RecClaim, RecLocal:
		w.record(n)
	case RecNeither:
		w.neither(n)
	}
	if act.Hold {
		w.pool = append(w.pool, event{kind: evExpire, rep: rep, n: n})
		if n == 0 && act.Recheck {
			w.pool = append(w.pool, event{kind: evRecheck, rep: rep, n: n})
		}
	} else if act.Recheck && n == 0 && h.rechecks < 1 {
		h.rechecks++
		w.pool = append(w.pool, event{kind: evRecheck, rep: rep, n: n})
	}
	if act.Repark {
		w.pool = append(w.pool, event{kind: evRepark, rep: rep, n: n})
	}
	if act.AskExpire {
		if ev == WExpired {
			w.pool = append(w.pool, event{kind: evAskExpire, rep: rep, n: n})
		} else {
			w.askExpire(rep, n)
		}
	}
}

func (w *world) askExpire(rep, n int) {
	p := w.d.parks[n]
	w.step(rep, n, WExpired, w.swap(Op{Park: p, Expire: true}).How)
}

// settle is a note's claim made on a replica: the party's own replica
// records it through its table; another records it from the note.
func (w *world) settle(rep, n int) {
	if h := w.held[rep][n]; h != nil {
		w.step(rep, n, WClaim, HowNone)
		return
	}
	if h := w.held[1-rep][n]; h != nil {
		// Held on the other replica: this one records it from the note
		// (streamFromNote); the holder learns of it at its next look.
		w.record(n)
		return
	}
	w.record(n)
}

func (w *world) run(e event) {
	w.log(histItem{what: 'e', kind: e.kind, rep: e.rep, n: e.n})
	switch e.kind {
	case evEnd:
		w.onEnd(e)
	case evPark:
		w.onPark(e)
	case evEntry:
		w.onEntry(e)
	case evResend:
		w.onResend(e)
	case evObserve:
		w.onObserve(e)
	case evArrive:
		w.arriveOp(e.rep, e.n)
	case evExpire:
		w.step(e.rep, e.n, WExpire, HowNone)
	case evRepark:
		w.onRepark(e)
	case evAskExpire:
		w.onAskExpire(e)
	case evRecheck:
		w.onRecheck(e)
	case evRecord:
		w.record(e.n)
	}
}

func (w *world) onEnd(e event) {
	d := w.d
	h := &held{w: WaitLive}
	if old := w.held[0][0]; old != nil {
		h.kept = old.kept
	}
	w.held[0][0] = h
	if h.kept != nil && !d.observer {
		// The route profile: an entry kept while live is recorded at
		// the stream's end (finishDecision).
		h.w = WaitDone
		w.record(0)
		return
	}
	w.step(0, 0, WEnd, HowNone)
	how := w.swap(Op{ID: "p0", Park: d.parks[0]}).How
	h.unanswered = unknown(how)
	w.step(0, 0, WAnswer, how)
	if h.kept != nil && w.held[0][0].w != WaitDone {
		// The observer profile: the kept entry goes to the note now.
		w.entryHeld(0, 0)
	}
}

func (w *world) onPark(e event) {
	d := w.d
	h := &held{w: WaitParking}
	w.held[e.rep][e.n] = h
	act := w.swap(Op{ID: fmt.Sprint("p", e.n), Park: d.parks[e.n]})
	h.unanswered = unknown(act.How)
	if act.Older != nil {
		w.settle(e.rep, act.Older.N)
	}
	w.step(e.rep, e.n, WAnswer, act.How)
}

func (w *world) onEntry(e event) {
	h := w.held[e.rep][e.n]
	if e.n == 0 && e.rep == 0 && h == nil {
		// Live on A: kept for the stream's end.
		w.held[0][0] = &held{w: WaitLive, kept: &Entry{Cluster: "c"}}
		return
	}
	if h != nil && h.w != WaitDone && e.n == 0 {
		w.entryHeld(e.rep, e.n)
		return
	}
	w.entryOp(e.rep, e.n, e.op)
}

func (w *world) onResend(e event) {
	switch e.op.Event() {
	case EvEntry:
		w.entryOp(e.rep, e.n, e.op)
	case EvArrive:
		w.arriveOp(e.rep, e.n)
	}
}

func (w *world) onObserve(e event) {
	switch act := w.swap(Op{Observe: true}); act.How {
	case HowObserved:
		w.record(0)
		if h := w.held[e.rep][0]; h != nil && h.w != WaitDone {
			h.w = WaitDone // observedHere: its wait ends, nothing to record
		}
	case HowObserveFirst, HowUnreachable, HowFailed:
		w.record(0)
	}
}

func (w *world) onRepark(e event) {
	d := w.d
	if h := w.held[e.rep][e.n]; h != nil && (h.unanswered || h.w == WaitAlone || h.w == WaitGone) {
		act := w.swap(Op{ID: fmt.Sprint("p", e.n), Park: d.parks[e.n]})
		h.unanswered = unknown(act.How)
		if h.unanswered && h.w == WaitDone {
			w.pool = append(w.pool, event{kind: evRepark, rep: e.rep, n: e.n})
		}
		if act.Older != nil {
			w.settle(e.rep, act.Older.N)
		}
		w.step(e.rep, e.n, WAnswer, act.How)
	}
}

func (w *world) onAskExpire(e event) {
	if h := w.held[e.rep][e.n]; h != nil && (h.w == WaitExpiring || h.w == WaitLate) {
		w.askExpire(e.rep, e.n)
	}
}

func (w *world) onRecheck(e event) {
	d := w.d
	if h := w.held[e.rep][e.n]; h != nil && h.w == WaitNote {
		w.step(e.rep, e.n, WAnswer, w.existing(Op{ID: fmt.Sprint("p", e.n), Park: d.parks[e.n]}).How)
	}
}

// entryHeld is an entry reaching the replica that holds the decision
// (accesslog.go entryForStream).
func (w *world) entryHeld(rep, n int) {
	h := w.held[rep][n]
	switch h.w {
	case WaitAlone, WaitGone:
		w.step(rep, n, WLocal, HowNone)
		return
	}
	switch act := w.swap(Op{ID: "e0", Entry: &Entry{Cluster: "c"}}); act.How {
	case HowEntry:
		w.step(rep, n, WClaim, HowNone)
	case HowUnreachable, HowFailed:
		w.step(rep, n, WLocal, HowNone)
	}
}

// entryOp is an entry for a party this replica does not hold (meet.go
// entry): through the note; an unknown answer is sent again.
func (w *world) entryOp(rep, n int, op Op) {
	if op.Entry == nil {
		c := "c"
		if n > 0 {
			c = fmt.Sprint("c", n)
		}
		op = Op{ID: fmt.Sprint("e", n), Entry: &Entry{Cluster: c, Attempt: uint32(n)}}
	}
	switch act := w.swap(op); act.How {
	case HowEntry, HowConnErr:
		w.settle(rep, act.Claim.N)
	case HowUnreachable, HowFailed:
		if h := w.held[rep][n]; h != nil && h.w != WaitDone {
			w.step(rep, n, WLocal, HowNone)
			return
		}
		w.pool = append(w.pool, event{kind: evResend, rep: rep, n: n, op: op})
	}
}

// arriveOp: attempt n began on rep (meet.go arrived).
func (w *world) arriveOp(rep, n int) {
	switch act := w.swap(Op{ID: fmt.Sprint("a", n), Arrive: n}); act.How {
	case HowConnErr:
		w.settle(rep, act.Claim.N)
	case HowUnreachable, HowFailed:
		if h := w.held[rep][n-1]; h != nil && h.w != WaitDone && h.w != WaitParking {
			w.step(rep, n-1, WLocal, HowNone)
			return
		}
		w.pool = append(w.pool, event{kind: evResend, rep: rep, n: n, op: Op{Arrive: n}})
	}
}

func (w *world) check(d replicaDeployment) string {
	for n := range d.parks {
		got := w.keys[max(n, 1)]
		switch {
		case d.real[n] && !got:
			return fmt.Sprintf("%s: party %d had a real outcome, recorded nowhere\n  %s", d.name, n, w.history())
		case !d.real[n] && got:
			return fmt.Sprintf("%s: party %d had no real outcome, recorded\n  %s", d.name, n, w.history())
		case w.neith[n] > 1:
			return fmt.Sprintf("%s: party %d: %d neithers\n  %s", d.name, n, w.neith[n], w.history())
		}
	}
	return ""
}

// histItem is one step of a history, written out only when a check fails.
type histItem struct {
	what byte // e: an event; s: a store call; r: a record; n: a neither; w: a local row
	kind evKind
	rep  int
	ev   uint8
	n    int
	ans  answer
}

// histNode: histories share their beginnings (a list from the end).
type histNode struct {
	h    histItem
	prev *histNode
}

func (w *world) log(h histItem) { w.hist = &histNode{h, w.hist} }

func (w *world) history() string {
	var b []string
	for n := w.hist; n != nil; n = n.prev {
		b = append(b, "")
		copy(b[1:], b)
		switch h := n.h; h.what {
		case 'e':
			b[0] = event{kind: h.kind, rep: h.rep, n: h.n}.String()
		case 's':
			b[0] = fmt.Sprintf("%s:%s", Event(h.ev), answerNames[h.ans])
		case 'r':
			b[0] = fmt.Sprintf("record%d:%s", h.n, answerNames[h.ans])
		case 'n':
			b[0] = fmt.Sprintf("neither%d", h.n)
		case 'w':
			b[0] = fmt.Sprintf("W%d", h.n)
		}
	}
	return strings.Join(b, " ")
}
