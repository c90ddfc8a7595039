package processor

import (
	"context"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// Where the attempts of one request meet (SPEC R-X7). An attempt whose
// stream ends before any response headers — a connect failure, a reset, a
// per-try timeout, or a client that went away; Envoy tells an upstream
// filter nothing of which — is parked. Envoy then either retries (the next
// attempt arrives: the parked one was a connection_error), writes an access
// log entry that says what happened (R-AL5), or neither (after parkFor, a
// neither that frees its probe slot, R-O8).
//
// Envoy spreads attempt streams and access log streams over every fusebox
// replica (docs/envoy.md, "Several fusebox replicas"), so they meet in a
// note in the store, named by the decision id the route role put in the
// chain, never by a header a client can send. The note holds what any
// replica needs to record the parked attempt (route, admission, start), so
// whichever replica claims it records it; the claim is the note's
// compare-and-set, so exactly one does. Notes expire by themselves: memory
// is bounded by the store, and nothing is scanned per retry.

const parkFor = 5 * time.Second

// claimsLife is how long a note that made claims for operations with an
// id lives (lifecycle.Note.Claims): a blip, a failover, a fork's pause.
const claimsLife = time.Minute

// meetings runs note operations and keeps this replica's parked attempts
// (their streams and park timers).
type meetings struct {
	s   *Server
	ttl time.Duration
	max int

	mu   sync.Mutex
	here map[string]*parkedHere
	// early counts the early-entry notes made since earlyFrom (R-DL5).
	early     int
	earlyFrom int64
	// resending counts the operations being sent again (maxResends).
	resending int
}

// parkedHere is an attempt held on this replica; its fields are guarded
// by meetings.mu. Where it is (w) moves by the replica-local table
// (lifecycle.WaitStep).
type parkedHere struct {
	st      *stream
	note    lifecycle.Park
	timer   breaker.Timer
	w       lifecycle.Wait
	rewrite parkRewrite
}

func newMeetings(s *Server) *meetings {
	return &meetings{s: s, ttl: parkFor, max: 10000, here: map[string]*parkedHere{}}
}

func noteName(decision string) string { return "a:" + decision }

// run applies op to decision's note by compare-and-set, starting from the
// guess prev (nil: no note), and returns what it did. A store that errs
// reports lifecycle.HowUnreachable, never a swap on a private table (R-DL7).
func (m *meetings) run(decision string, prev []byte, op lifecycle.Op) lifecycle.Act {
	var cur lifecycle.Note
	if prev != nil {
		_ = lifecycle.Decode(prev, &cur)
	}
	for range 5 {
		next, act := lifecycle.Step(cur, op)
		raw := next.Encode()
		got, ok, err := m.s.store.SwapNote(context.Background(), noteName(decision), prev, raw, m.noteTTL(next))
		if err != nil {
			if errors.Is(err, breaker.ErrNotesFull) {
				return lifecycle.Act{How: lifecycle.HowFailed}
			}
			m.s.metrics.DecisionEvents.WithLabelValues(op.Event().String(), "meet_unreachable").Inc()
			return lifecycle.Act{How: lifecycle.HowUnreachable}
		}
		if ok {
			m.count(op.Event(), act)
			return act
		}
		prev, cur = got, lifecycle.Note{}
		if got != nil && lifecycle.Decode(got, &cur) != nil {
			cur = lifecycle.Note{} // not ours: overwritten by the next try
		}
	}
	m.s.metrics.InternalErrors.WithLabelValues("attempt_note").Inc()
	return lifecycle.Act{How: lifecycle.HowFailed}
}

// noteTTL: a note lives past the longest wait of what it holds. Only two
// states wait for a response: a route-role decision (N 0) parked and not
// yet expired, and an observer that came before the route role's park (on
// Envoy 1.36 the route role's stream ends with the response); they live
// decision_wait_sec. Anything else lives a park time: long enough for a
// late or duplicate event to find it. (Every observed decision's note
// living decision_wait_sec would hold 300 s of traffic in the store.)
func (m *meetings) noteTTL(n lifecycle.Note) time.Duration {
	waiting := n.Parked != nil && n.Parked.N == 0 && !n.Expired
	if waiting || n.Obs && !n.Done {
		return max(m.s.cfg.Load().DecisionWait, m.ttl) + time.Second
	}
	if len(n.Claims) > 0 {
		// An operation whose answer was lost is sent again for as long as
		// the store stays away: its claim must still be there to answer it.
		return claimsLife
	}
	return m.ttl + time.Second
}

// count tells fusebox_decision_events_total what an event became.
func (m *meetings) count(ev lifecycle.Event, act lifecycle.Act) {
	var r string
	switch act.How {
	case lifecycle.HowDuplicate, lifecycle.HowByObserver:
		r = "duplicate"
	case lifecycle.HowMismatch:
		r = "mismatch"
	case lifecycle.HowConnErr, lifecycle.HowEntry, lifecycle.HowObserved, lifecycle.HowObserveFirst:
		r = "recorded"
		if act.Late {
			r = "late"
		}
	default:
		return
	}
	m.s.metrics.DecisionEvents.WithLabelValues(ev.String(), r).Inc()
}

// parkID names a park as a note operation: the attempt and its start, so
// that the same park sent again gets the answer it got (Note.Claims), and a
// replayed token's attempt (another start) does not.
func parkID(p *lifecycle.Park) string {
	return "p" + strconv.Itoa(p.N) + "." + strconv.FormatInt(p.Start, 36)
}

// newOpID names one event's note operation (an entry, an arrival): 64
// random bits after its kind.
func newOpID(kind byte) string {
	var b [8]byte
	src := idSources.Get().(*mrand.ChaCha8)
	_, _ = src.Read(b[:])
	idSources.Put(src)
	return string(kind) + hex.EncodeToString(b[:])
}

// park keeps st, which ended before any response headers, until its
// request's next attempt, an access log entry or the park time.
func (m *meetings) park(a *attemptStream) {
	st := a.j
	if st.decisionID == "" {
		st.recordNeither()
		return
	}
	if g := st.gate; g != nil && g.wait() {
		// A replayed token's attempt: nothing to park or record. (Parking
		// is off the request path: the stream has ended.)
		st.recorded = true
		return
	}
	now := st.now()
	id := st.decisionID
	p := lifecycle.Park{N: a.n, Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
		RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease,
		Start: st.startNs, Elapsed: max((now-st.startNs)/1e6, 0), Expect: a.expect}
	m.mu.Lock()
	full := len(m.here) >= m.max
	m.mu.Unlock()
	act := m.run(id, nil, lifecycle.Op{ID: parkID(&p), Park: &p})
	if act.Older != nil {
		m.settle(id, act.Older, lifecycle.HowConnErr, entryOutcome{}, act.OlderLate)
	}
	switch {
	case full && act.How == lifecycle.HowParked:
		// Past the parked map's bound (held.go): parked in the note only,
		// where the retry or the entry that comes claims it, on any
		// replica. Before, it was a neither at once: a flood of parks
		// turned the genuine connection errors after it into neithers.
		st.s.metrics.DecisionEvents.WithLabelValues("park", "not_held").Inc()
		return
	case full && unknownAnswer(act.How):
		// Neither in the note nor here: the bound holds during a blip.
		st.recordNeither()
		return
	}
	h := &parkedHere{st: st, note: p, w: lifecycle.WaitParking, rewrite: parkRewrite{unanswered: unknownAnswer(act.How)}}
	m.mu.Lock()
	old := m.here[id]
	m.here[id] = h
	m.mu.Unlock()
	if old != nil && old.note.N < p.N {
		// An earlier attempt of the request held here: this one began, so
		// Envoy retried it (its note's claim, if it was answered, went
		// through Older above and settled it already).
		m.local(id, old, func(p *lifecycle.Park) bool { return true }, func(st *stream, p lifecycle.Park) { st.recordRetried(p) })
	}
	m.answer(id, h, act)
}

// answer applies the note's answer to a park (the first, or one written
// again) of h.
func (m *meetings) answer(id string, h *parkedHere, act lifecycle.Act) {
	wa := m.step(id, h, lifecycle.WAnswer, act.How)
	if wa.Rec == lifecycle.RecClaim && act.How == lifecycle.HowEntry {
		m.s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
	}
	m.do(id, h, wa, act.How, act.Res, act.Late, nil)
}

// step moves h by the replica-local table; a party that is done leaves
// the parked map.
func (m *meetings) step(id string, h *parkedHere, ev lifecycle.WaitEvent, how lifecycle.How) lifecycle.WaitAct {
	m.mu.Lock()
	defer m.mu.Unlock()
	act := lifecycle.WaitStep(h.w, ev, how)
	h.w = act.Next
	if act.Next == lifecycle.WaitDone {
		if m.here[id] == h {
			delete(m.here, id)
		}
		if h.timer != nil {
			h.timer.Stop()
		}
	}
	return act
}

// do does what the replica-local table said for h: record (the note's
// claim how/res, or what reached this replica, local), hold it, write its
// park again, apply its expiry. noteLate: the note's claim was of an
// expired park.
func (m *meetings) do(id string, h *parkedHere, act lifecycle.WaitAct, how lifecycle.How, res lifecycle.Entry, noteLate bool, local func(*stream, lifecycle.Park)) {
	st := h.st
	if act.Rec == lifecycle.RecClaim || act.Rec == lifecycle.RecLocal {
		if act.Late || noteLate || st.recorded {
			// Its neither was recorded (its slot freed): the real outcome
			// is recorded without the slot, on a stream of its own.
			if st = m.s.streamFromNote(id, &h.note); st == nil {
				return // its route is gone (a reload since)
			}
			st.adm.Route.Lease, st.adm.Fleet.Lease = 0, 0
		}
	}
	switch act.Rec {
	case lifecycle.RecClaim:
		switch how {
		case lifecycle.HowConnErr:
			st.recordRetried(h.note)
		case lifecycle.HowEntry:
			st.recordEntry(fromEntry(res))
		}
	case lifecycle.RecLocal:
		if local != nil {
			local(st, h.note)
		}
	case lifecycle.RecNeither:
		st.recordNeitherExpired()
	}
	m.mu.Lock()
	if act.Hold && h.w != lifecycle.WaitDone {
		h.timer = breaker.AfterFunc(m.s.clock, m.ttl, func() { m.expire(id, h) })
	}
	repark := act.Repark || h.rewrite.unanswered
	m.mu.Unlock()
	if repark {
		m.repark(id, h)
	}
	if act.AskExpire {
		m.askExpire(id, h)
	}
}

// reparkEvery is how often a park whose answer was unknown is written
// again.
const reparkEvery = 250 * time.Millisecond

// repark writes h's park again once the meeting place answers, off the
// request path, every reparkEvery while h waits here alone or its park's
// answer is unknown (R-DL12): an attempt parked during a blip must meet
// the retry, the entry or the expiry that come after it on any replica,
// and a park whose reply was lost learns what it claimed (its id gets the
// answer it got). It gives up when the attempt's record key ends.
func (m *meetings) repark(id string, h *parkedHere) {
	m.mu.Lock()
	start := h.rewrite.start(m.s.clock.Now().UnixNano(), h.st.keyLife())
	m.mu.Unlock()
	if !start {
		return
	}
	breaker.AfterFunc(m.s.clock, reparkEvery, func() {
		m.mu.Lock()
		write, giveUp := h.rewrite.fire(m.s.clock.Now().UnixNano(), h.w == lifecycle.WaitAlone || h.w == lifecycle.WaitGone)
		m.mu.Unlock()
		switch {
		case giveUp:
			m.do(id, h, m.step(id, h, lifecycle.WGiveUp, lifecycle.HowNone), lifecycle.HowNone, lifecycle.Entry{}, false, nil)
		case write:
			act := m.run(id, nil, lifecycle.Op{ID: parkID(&h.note), Park: &h.note})
			m.mu.Lock()
			h.rewrite.unanswered = unknownAnswer(act.How)
			m.mu.Unlock()
			if act.Older != nil {
				m.settle(id, act.Older, lifecycle.HowConnErr, entryOutcome{}, act.OlderLate)
			}
			m.answer(id, h, act)
		}
	})
}

// expire ends h's park time (its timer).
func (m *meetings) expire(id string, h *parkedHere) {
	m.do(id, h, m.step(id, h, lifecycle.WExpire, lifecycle.HowNone), lifecycle.HowNone, lifecycle.Entry{}, false, nil)
}

// askExpire applies h's expiry to its note: a neither that frees its slot,
// unless another attempt or an entry claimed it first (on any replica).
func (m *meetings) askExpire(id string, h *parkedHere) {
	m.mu.Lock()
	w := h.w
	m.mu.Unlock()
	how, ok := m.expireOp(id, w, &h.note)
	if !ok {
		return
	}
	act := m.step(id, h, lifecycle.WExpired, how)
	if act.AskExpire {
		// Unknown: applied again after a while.
		act.AskExpire = false
		breaker.AfterFunc(m.s.clock, reparkEvery, func() { m.askExpire(id, h) })
	}
	m.do(id, h, act, how, lifecycle.Entry{}, false, nil)
}

// expireOp applies the expiry of p, held in state w, to its note, and
// gives the answer; false when w applies none (not expiring).
func (m *meetings) expireOp(decision string, w lifecycle.Wait, p *lifecycle.Park) (lifecycle.How, bool) {
	if w != lifecycle.WaitExpiring && w != lifecycle.WaitLate {
		return lifecycle.HowNone, false
	}
	cur := lifecycle.Note{Parked: p}
	return m.run(decision, cur.Encode(), lifecycle.Op{Park: p, Expire: true}).How, true
}

// local has the attempt held here that match picks be settled by what
// reached this replica while the meeting place did not answer (record):
// false when none is held, or the table says it is not to be.
func (m *meetings) local(decision string, h *parkedHere, match func(p *lifecycle.Park) bool, record func(*stream, lifecycle.Park)) bool {
	m.mu.Lock()
	if h == nil {
		h = m.here[decision]
	}
	if h == nil || !match(&h.note) || lifecycle.WaitStep(h.w, lifecycle.WLocal, lifecycle.HowNone).Rec != lifecycle.RecLocal {
		m.mu.Unlock()
		return false
	}
	m.mu.Unlock()
	m.do(decision, h, m.step(decision, h, lifecycle.WLocal, lifecycle.HowNone), lifecycle.HowNone, lifecycle.Entry{}, false, record)
	return true
}

// arrived tells the note that attempt n of decision began: a parked
// earlier attempt was retried, and an attempt number that arrives a second
// time is a replayed token (R-DL4): g hears which. It runs off the
// attempt's request path (a slow store must not delay it).
func (m *meetings) arrived(decision string, n int, g *arrivalGate) {
	if decision == "" {
		g.open(false)
		return
	}
	go func() {
		op := lifecycle.Op{ID: newOpID('a'), Arrive: n}
		act := m.run(decision, nil, op)
		g.open(act.How == lifecycle.HowDuplicate && !act.Again)
		m.arrivalAct(decision, n, op, act)
	}()
}

// arrivalAct does what the note answered an arrival.
func (m *meetings) arrivalAct(decision string, n int, op lifecycle.Op, act lifecycle.Act) {
	switch {
	case act.How == lifecycle.HowConnErr:
		m.settle(decision, act.Claim, lifecycle.HowConnErr, entryOutcome{}, act.Late)
	case unknownAnswer(act.How):
		if m.local(decision, nil, func(p *lifecycle.Park) bool { return p.N < n }, func(st *stream, p lifecycle.Park) { st.recordRetried(p) }) {
			return
		}
		m.resend(decision, "arrive", op, func(act lifecycle.Act) { m.arrivalAct(decision, n, op, act) })
	}
}

// maxResends bounds the operations a replica sends again at once (an
// entry or an arrival whose answer was unknown); past it they are dropped
// and counted (decision_events{result="resend_dropped"}).
const maxResends = 8192

// resend sends op again, off the request path, every reparkEvery (up to
// 5 s apart) until the note answers or the record key's life ends, and
// hands the answer to then (R-DL12). An unknown answer is never read as
// "not applied": the note may have taken the operation and claimed a
// party with it, which only its answer to the same id says.
func (m *meetings) resend(decision, event string, op lifecycle.Op, then func(lifecycle.Act)) {
	m.mu.Lock()
	if m.resending >= maxResends {
		m.mu.Unlock()
		m.s.metrics.DecisionEvents.WithLabelValues(event, "resend_dropped").Inc()
		return
	}
	m.resending++
	m.mu.Unlock()
	m.s.metrics.DecisionEvents.WithLabelValues(event, "resent").Inc()
	life := lifecycle.RecordKeyLife(0, 0)
	if rt := m.s.cfg.Load(); rt != nil {
		life = lifecycle.RecordKeyLife(rt.DecisionWait, rt.AccessLogWait)
	}
	until := m.s.clock.Now().Add(life)
	every := reparkEvery
	var try func()
	try = func() {
		act := m.run(decision, nil, op)
		if unknownAnswer(act.How) && m.s.clock.Now().Before(until) {
			every = min(2*every, 5*time.Second)
			breaker.AfterFunc(m.s.clock, every, try)
			return
		}
		m.mu.Lock()
		m.resending--
		m.mu.Unlock()
		if !unknownAnswer(act.How) {
			then(act)
		}
	}
	breaker.AfterFunc(m.s.clock, every, try)
}

// arrivalGate is what the note said of an attempt's arrival: a replayed
// token's attempt records nothing. The attempt's response may be judged
// before the note answers; its record then waits for the answer off the
// reply path (record), bounded by gateWait.
type arrivalGate struct {
	done   chan struct{}
	replay atomic.Bool
	clock  breaker.Clock // the server's: the wait's bound runs on it
}

// gateWait bounds how long a record waits for the arrival's answer; past
// it the attempt is recorded (a meeting place that does not answer must
// not lose an outcome, R-DL7).
const gateWait = time.Second

func newArrivalGate(c breaker.Clock) *arrivalGate {
	return &arrivalGate{done: make(chan struct{}), clock: c}
}

func (g *arrivalGate) open(replay bool) {
	g.replay.Store(replay)
	close(g.done)
}

// known reports whether the answer came, and whether it was a replay.
func (g *arrivalGate) known() (known, replay bool) {
	select {
	case <-g.done:
		return true, g.replay.Load()
	default:
		return false, false
	}
}

// wait waits for the answer (at most gateWait) and reports a replay.
func (g *arrivalGate) wait() bool {
	select {
	case <-g.done:
		return g.replay.Load()
	default:
	}
	expired := make(chan struct{})
	t := breaker.AfterFunc(g.clock, gateWait, func() { close(expired) })
	defer t.Stop()
	select {
	case <-g.done:
		return g.replay.Load()
	case <-expired:
		return false
	}
}

// maxEarly bounds the notes this replica creates for entries that name no
// decision it knows, per park time (R-DL5): such an entry may be early (the
// decision's stream ends on another replica soon), or forged, or a flood
// of random ids. Past the bound they are dropped and counted, so they never
// fill the note table that real decisions and parked attempts wait in (on
// memory 2^17 notes; on Redis, keys).
const maxEarly = 8192

// earlyAllowed takes one of this park time's early-entry notes.
func (m *meetings) earlyAllowed() bool {
	now := m.s.clock.Now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	if now-m.earlyFrom >= int64(m.ttl) {
		m.earlyFrom, m.early = now, 0
	}
	if m.early >= maxEarly {
		return false
	}
	m.early++
	return true
}

// entry applies an access log entry to decision's note (R-AL5). ok is
// false when no attempt was parked yet (the entry waits in the note).
func (m *meetings) entry(decision string, out entryOutcome) (string, bool) {
	if !out.chained() && !m.earlyAllowed() {
		// An entry for a decision this replica does not hold may only
		// wait in a note within the budget: an existing note (a parked
		// attempt, a waiting decision) still takes it.
		if act := m.runExisting(decision, out.noteOp()); act.How != lifecycle.HowNone {
			return m.entryAct(decision, out, act)
		}
		m.s.metrics.DecisionEvents.WithLabelValues("entry", "dropped").Inc()
		return EntryUnknown, true
	}
	return m.entryAct(decision, out, m.run(decision, nil, out.noteOp()))
}

// runExisting applies op only to a note that exists (it creates none).
func (m *meetings) runExisting(decision string, op lifecycle.Op) lifecycle.Act {
	got, ok, err := m.s.store.SwapNote(context.Background(), noteName(decision), nil, nil, time.Second)
	if err != nil || ok || got == nil {
		// ok: there was no note (deleting nothing succeeded).
		return lifecycle.Act{}
	}
	return m.run(decision, got, op)
}

func (m *meetings) entryAct(decision string, out entryOutcome, act lifecycle.Act) (string, bool) {
	switch act.How {
	case lifecycle.HowEntry:
		m.settle(decision, act.Claim, lifecycle.HowEntry, fromEntry(act.Res), act.Late)
		return EntryRecorded, true
	case lifecycle.HowConnErr:
		// NC/UH for a later attempt: the parked one was retried, and the
		// entry is the later attempt's own outcome.
		m.settle(decision, act.Claim, lifecycle.HowConnErr, entryOutcome{}, act.Late)
		m.s.recordChained(decision, out)
		return EntryRecorded, true
	case lifecycle.HowChained:
		m.s.recordChained(decision, out)
		return EntryRecorded, true
	case lifecycle.HowMismatch:
		return EntryClusterMismatch, true
	case lifecycle.HowDuplicate, lifecycle.HowByObserver:
		return EntryDuplicate, true
	case lifecycle.HowUnreachable, lifecycle.HowFailed:
		if m.local(decision, nil, out.matchesNote, func(st *stream, _ lifecycle.Park) { st.recordEntry(out) }) {
			return EntryRecorded, true
		}
		// The note may have taken it, or not: sent again with its id
		// until it answers (R-DL12).
		m.resend(decision, "entry", out.noteOp(), func(act lifecycle.Act) {
			if r, _ := m.entryAct(decision, out, act); r == EntryRecorded {
				m.s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
			}
		})
		return EntryResent, true
	}
	return "", false
}

// settle records a claimed attempt: with its own stream when it is held
// on this replica (through the replica-local table: the note's claim is
// the authority), else with one rebuilt from the note. A late claim (its
// park time had ended and freed its slot) is recorded without the slot.
func (m *meetings) settle(decision string, p *lifecycle.Park, how lifecycle.How, out entryOutcome, late bool) {
	m.mu.Lock()
	h := m.here[decision]
	if h != nil && h.note != *p {
		h = nil
	}
	m.mu.Unlock()
	if h != nil {
		m.do(decision, h, m.step(decision, h, lifecycle.WClaim, how), how, lifecycle.Entry{Res: out.res, Cluster: out.cluster, Attempt: out.attempt}, late, nil)
		return
	}
	st := m.s.streamFromNote(decision, p)
	if st == nil {
		return // its route is gone (a reload since)
	}
	if late {
		st.adm.Route.Lease, st.adm.Fleet.Lease = 0, 0
	}
	switch how {
	case lifecycle.HowConnErr:
		st.recordRetried(*p)
	case lifecycle.HowEntry:
		st.recordEntry(out)
	default:
		st.recordNeither()
	}
}

// streamFromNote rebuilds what recording a parked attempt needs on a
// replica that did not serve it.
func (s *Server) streamFromNote(decision string, p *lifecycle.Park) *stream {
	st := newStream(s)
	st.rt = s.cfg.Load()
	st.comp = s.compiledFor(st.rt)
	gw, ok := st.rt.Gateway(p.Gateway)
	if !ok {
		return nil
	}
	route, ok := gw.Routes[p.Route]
	if !ok || st.comp.targets[route] == nil {
		return nil
	}
	st.gw, st.chosen, st.target = gw, route, st.comp.targets[route]
	st.adm = breaker.TargetAdmission{Route: breaker.Admission{Gen: p.RouteGen, Lease: p.RouteLease},
		Fleet: breaker.Admission{Gen: p.FleetGen, Lease: p.FleetLease}}
	st.startNs, st.decisionID, st.attempt = p.Start, decision, p.N
	st.tracked = !st.target.Peek(context.Background(), s.store, st.now()).Off
	return st
}

// recordChained records an NC or UH entry for attempt out.attempt of a
// failover decision (R-AL5): the router answered it before any upstream
// request, so no attempt stream exists to record it; it is charged to the
// chain group Envoy's priority_group specifier picked for that attempt, in
// the route's present generation.
func (s *Server) recordChained(decision string, out entryOutcome) {
	if len(out.chain) == 0 || out.attempt == 0 {
		return
	}
	g := min(int(out.attempt), len(out.chain)) - 1
	note := lifecycle.Park{N: int(out.attempt), Gateway: out.gateway, Route: out.chain[g]}
	if g < len(out.groups) {
		// The admission the route role sealed for that group.
		a := out.groups[g]
		note.RouteGen, note.RouteLease, note.FleetGen, note.FleetLease = a.RouteGen, a.RouteLease, a.FleetGen, a.FleetLease
	}
	st := s.streamFromNote(decision, &note)
	if st == nil {
		return // a gateway or route gone since (a reload)
	}
	if !st.tracked {
		st.reportClusterNotFound(out.res)
		return
	}
	st.startNs = st.now()
	if g >= len(out.groups) {
		// No sealed admission (a test's entry): the route's present
		// generation.
		st.adm, _ = st.target.Acquire(context.Background(), s.store, st.startNs, true)
	}
	st.recordEntry(out)
}

// len reports how many attempts are parked on this replica (tests).
func (m *meetings) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.here)
}
