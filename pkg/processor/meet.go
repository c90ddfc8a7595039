package processor

import (
	"context"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// Where the attempts of one request meet (SPEC R-X7). An attempt whose
// stream ends before any response headers — a connect failure, a reset, a
// per-try timeout, or a client that went away; Envoy tells an upstream
// filter nothing of which — is parked. Envoy then either retries (the next
// attempt arrives: the parked one was a connection_error), writes an access
// log entry that says what happened (R-AL5), or neither (after lifecycle.ParkFor, a
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

// meetings keeps this replica's parked attempts (their streams and park
// timers); notes runs their note operations (lifecycle.Notes).
type meetings struct {
	s     *Server
	notes *lifecycle.Notes
	ttl   time.Duration
	max   int

	mu   sync.Mutex
	here map[string]*parkedHere
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
	notes := &lifecycle.Notes{
		Store: s.store, Clock: s.clock,
		Waits: func() (time.Duration, time.Duration) {
			if rt := s.cfg.Load(); rt != nil {
				return rt.DecisionWait, rt.AccessLogWait
			}
			return 0, 0
		},
		Count:    func(event, result string) { s.metrics.DecisionEvents.WithLabelValues(event, result).Inc() },
		Internal: func(where string) { s.metrics.InternalErrors.WithLabelValues(where).Inc() },
		// Ended by Stop with every other timer of the server (timers.go).
		AfterFunc: func(d time.Duration, f func()) breaker.Timer { return s.timers.after(s.clock, d, f) },
	}
	return &meetings{s: s, notes: notes, ttl: lifecycle.ParkFor, max: 10000, here: map[string]*parkedHere{}}
}

// park keeps st, which ended before any response headers, until its
// request's next attempt, an access log entry or the park time.
func (m *meetings) park(a *attemptStream) {
	st := a.j
	if st.decisionID == "" {
		st.recordNeither()
		return
	}
	if g := st.gate; g != nil && g.Wait() {
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
	act := m.notes.Run(id, nil, lifecycle.Op{ID: lifecycle.ParkID(&p), Park: &p})
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
	case full && lifecycle.Unknown(act.How):
		// Neither in the note nor here: the bound holds during a blip.
		st.recordNeither()
		return
	}
	h := &parkedHere{st: st, note: p, w: lifecycle.WaitParking, rewrite: parkRewrite{unanswered: lifecycle.Unknown(act.How)}}
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
		h.timer = m.s.timers.after(m.s.clock, m.ttl, func() { m.expire(id, h) })
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

// repark writes h's park again once the meeting place answers, off the
// request path, every lifecycle.ResendEvery while h waits here alone or its park's
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
	m.s.timers.after(m.s.clock, lifecycle.ResendEvery, func() {
		m.mu.Lock()
		write, giveUp := h.rewrite.fire(m.s.clock.Now().UnixNano(), h.w == lifecycle.WaitAlone || h.w == lifecycle.WaitGone)
		m.mu.Unlock()
		switch {
		case giveUp:
			m.do(id, h, m.step(id, h, lifecycle.WGiveUp, lifecycle.HowNone), lifecycle.HowNone, lifecycle.Entry{}, false, nil)
		case write:
			act := m.notes.Run(id, nil, lifecycle.Op{ID: lifecycle.ParkID(&h.note), Park: &h.note})
			m.mu.Lock()
			h.rewrite.unanswered = lifecycle.Unknown(act.How)
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
		m.s.timers.after(m.s.clock, lifecycle.ResendEvery, func() { m.askExpire(id, h) })
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
	return m.notes.Run(decision, cur.Encode(), lifecycle.Op{Park: p, Expire: true}).How, true
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
func (m *meetings) arrived(decision string, n int, g *lifecycle.ArrivalGate) {
	if decision == "" {
		g.Open(false)
		return
	}
	go func() {
		op := lifecycle.Op{ID: lifecycle.NewOpID('a'), Arrive: n}
		act := m.notes.Run(decision, nil, op)
		g.Open(act.How == lifecycle.HowDuplicate && !act.Again)
		m.arrivalAct(decision, n, op, act)
	}()
}

// arrivalAct does what the note answered an arrival.
func (m *meetings) arrivalAct(decision string, n int, op lifecycle.Op, act lifecycle.Act) {
	switch {
	case act.How == lifecycle.HowConnErr:
		m.settle(decision, act.Claim, lifecycle.HowConnErr, entryOutcome{}, act.Late)
	case lifecycle.Unknown(act.How):
		if m.local(decision, nil, func(p *lifecycle.Park) bool { return p.N < n }, func(st *stream, p lifecycle.Park) { st.recordRetried(p) }) {
			return
		}
		m.notes.Resend(decision, "arrive", op, func(act lifecycle.Act) { m.arrivalAct(decision, n, op, act) })
	}
}

// entry applies an access log entry to decision's note (R-AL5). ok is
// false when no attempt was parked yet (the entry waits in the note).
func (m *meetings) entry(decision string, out entryOutcome) (string, bool) {
	if !out.chained() && !m.notes.EarlyAllowed() {
		// An entry for a decision this replica does not hold may only
		// wait in a note within the budget: an existing note (a parked
		// attempt, a waiting decision) still takes it.
		if act := m.notes.RunExisting(decision, out.noteOp()); act.How != lifecycle.HowNone {
			return m.entryAct(decision, out, act)
		}
		m.s.metrics.DecisionEvents.WithLabelValues("entry", "dropped").Inc()
		return EntryUnknown, true
	}
	return m.entryAct(decision, out, m.notes.Run(decision, nil, out.noteOp()))
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
		m.notes.Resend(decision, "entry", out.noteOp(), func(act lifecycle.Act) {
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
	if judge.RetryToUnknownCluster(out.flags, out.attempt, s.reached.has(st.chosen.Cluster)) {
		s.log.Warn("a retry's no-healthy-upstream reply went to a cluster Envoy was never seen to reach: read as a missing cluster (Envoy answers a retry to a cluster it lacks with UH, not NC)",
			"gateway", st.gw.ID, "route", st.chosen.Key, "cluster", st.chosen.Cluster, "attempt", out.attempt)
		out.res = judge.AsClusterNotFound(out.res)
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
