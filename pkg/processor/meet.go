package processor

import (
	"context"
	"errors"
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
}

type parkedHere struct {
	st    *stream
	note  lifecycle.Park
	timer breaker.Timer
	// local: the meeting place did not answer when it parked, so it waits
	// here only: what reaches this replica may still claim it (R-DL7),
	// and retry writes its note again (repark).
	local bool
	retry breaker.Timer
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
	p := lifecycle.Park{N: a.n, Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
		RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease,
		Start: st.startNs, Elapsed: max((now-st.startNs)/1e6, 0), Expect: a.expect}
	m.mu.Lock()
	full := len(m.here) >= m.max
	m.mu.Unlock()
	act := m.run(st.decisionID, nil, lifecycle.Op{Park: &p})
	if act.Older != nil {
		m.settle(st.decisionID, act.Older, lifecycle.HowConnErr, entryOutcome{}, act.OlderLate)
	}
	switch {
	case full && act.How == lifecycle.HowParked:
		// Past the parked map's bound (held.go): parked in the note only,
		// where the retry or the entry that comes claims it, on any
		// replica. Before, it was a neither at once: a flood of parks
		// turned the genuine connection errors after it into neithers.
		st.s.metrics.DecisionEvents.WithLabelValues("park", "not_held").Inc()
		return
	case full && act.How == lifecycle.HowUnreachable:
		// Neither in the note nor here: the bound holds during a blip.
		st.recordNeither()
		return
	}
	switch act.How {
	case lifecycle.HowParked:
		m.keep(st, p, false)
	case lifecycle.HowUnreachable:
		m.repark(st.decisionID, m.keep(st, p, true))
	case lifecycle.HowConnErr:
		st.recordRetried(p)
	case lifecycle.HowEntry:
		st.recordEntry(fromEntry(act.Res))
		st.s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
	case lifecycle.HowDuplicate:
		// A replayed token's attempt: recorded already.
	default:
		st.recordNeither()
	}
}

// reparkEvery is how often an attempt parked here alone (the meeting place
// did not answer) tries again to write its note.
const reparkEvery = 250 * time.Millisecond

// repark writes h's note once the meeting place answers again, off the
// request path, every reparkEvery until it is answered or h's park ends:
// an attempt parked during a blip must meet the retry, the entry or the
// expiry that come after it on any replica (R-DL12). Before, it waited on
// this replica alone for its whole park, and Envoy's retry arriving after
// the blip on any replica turned its connection error into a neither.
func (m *meetings) repark(id string, h *parkedHere) {
	var try func()
	try = func() {
		m.mu.Lock()
		live := m.here[id] == h && h.local
		m.mu.Unlock()
		if !live {
			return
		}
		act := m.run(id, nil, lifecycle.Op{Park: &h.note})
		if act.How == lifecycle.HowUnreachable {
			m.mu.Lock()
			if m.here[id] == h {
				h.retry = breaker.AfterFunc(m.s.clock, reparkEvery, try)
			}
			m.mu.Unlock()
			return
		}
		if act.Older != nil {
			m.settle(id, act.Older, lifecycle.HowConnErr, entryOutcome{}, act.OlderLate)
		}
		if act.How == lifecycle.HowParked || act.How == lifecycle.HowDuplicate {
			// Parked now, or parked already: the write whose answer was
			// lost had run (or a claim recorded it since, which the note's
			// expiry then finds).
			m.mu.Lock()
			if m.here[id] == h {
				h.local = false // in the note now: claimed there, like any park
				m.mu.Unlock()
				return
			}
			m.mu.Unlock()
			// Claimed here meanwhile (an arrival or an entry on this
			// replica during the blip): the note's park is a leftover its
			// expiry settles; a second record of the attempt is a repeat
			// its key turns away (R-DL11).
			return
		}
		// The note answered with the attempt's outcome (a retry or an
		// entry came first, on any replica): it is recorded here, once.
		m.mu.Lock()
		mine := m.here[id] == h
		if mine {
			delete(m.here, id)
			h.timer.Stop()
		}
		m.mu.Unlock()
		if !mine {
			return
		}
		switch act.How {
		case lifecycle.HowConnErr:
			h.st.recordRetried(h.note)
		case lifecycle.HowEntry:
			h.st.recordEntry(fromEntry(act.Res))
			m.s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
		default:
			h.st.recordNeither()
		}
	}
	m.mu.Lock()
	if m.here[id] == h {
		h.retry = breaker.AfterFunc(m.s.clock, reparkEvery, try)
	}
	m.mu.Unlock()
}

// keep holds a parked attempt's stream on this replica until its park
// time ends (on the server's clock).
func (m *meetings) keep(st *stream, p lifecycle.Park, local bool) *parkedHere {
	h := &parkedHere{st: st, note: p, local: local}
	id := st.decisionID
	m.mu.Lock()
	if old := m.here[id]; old != nil {
		old.timer.Stop()
	}
	m.here[id] = h
	h.timer = breaker.AfterFunc(m.s.clock, m.ttl, func() { m.expire(id, h) })
	m.mu.Unlock()
	return h
}

// expire ends h's park: a neither that frees its slot, unless another
// attempt or an entry claimed it first (on any replica). An expiry that
// cannot reach the note records nothing (R-DL7).
func (m *meetings) expire(id string, h *parkedHere) {
	m.mu.Lock()
	if m.here[id] == h {
		delete(m.here, id)
	}
	m.mu.Unlock()
	if h.local {
		h.st.recordNeitherExpired() // it never reached the note
		return
	}
	cur := lifecycle.Note{Parked: &h.note}
	if act := m.run(id, cur.Encode(), lifecycle.Op{Park: &h.note, Expire: true}); act.How == lifecycle.HowNeither {
		h.st.recordNeitherExpired()
	}
}

// claimHere takes an attempt parked on this replica alone (the meeting
// place did not answer when it parked) when match says the event claims
// it.
func (m *meetings) claimHere(decision string, match func(p *lifecycle.Park) bool) *parkedHere {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.here[decision]
	if h == nil || !h.local || !match(&h.note) {
		return nil
	}
	delete(m.here, decision)
	h.timer.Stop()
	return h
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
		act := m.run(decision, nil, lifecycle.Op{Arrive: n})
		g.open(act.How == lifecycle.HowDuplicate)
		switch act.How {
		case lifecycle.HowConnErr:
			m.settle(decision, act.Claim, lifecycle.HowConnErr, entryOutcome{}, act.Late)
		case lifecycle.HowUnreachable:
			if h := m.claimHere(decision, func(p *lifecycle.Park) bool { return p.N < n }); h != nil {
				h.st.recordRetried(h.note)
			}
		}
	}()
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
		if act := m.runExisting(decision, lifecycle.Op{Entry: out.op()}); act.How != lifecycle.HowNone {
			return m.entryAct(decision, out, act)
		}
		m.s.metrics.DecisionEvents.WithLabelValues("entry", "dropped").Inc()
		return EntryUnknown, true
	}
	return m.entryAct(decision, out, m.run(decision, nil, lifecycle.Op{Entry: out.op()}))
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
	case lifecycle.HowUnreachable:
		if h := m.claimHere(decision, out.matchesNote); h != nil {
			h.st.recordEntry(out)
			return EntryRecorded, true
		}
	}
	return "", false
}

// settle records a claimed attempt: with its own stream when it is parked
// on this replica, else with one rebuilt from the note. A late claim (its
// park time had ended and freed its slot) is recorded without the slot.
func (m *meetings) settle(decision string, p *lifecycle.Park, how lifecycle.How, out entryOutcome, late bool) {
	m.mu.Lock()
	h := m.here[decision]
	var st *stream
	if h != nil && h.note == *p && !late {
		delete(m.here, decision)
		h.timer.Stop()
		st = h.st
	}
	m.mu.Unlock()
	if st == nil {
		if st = m.s.streamFromNote(decision, p); st == nil {
			return // its route is gone (a reload since)
		}
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
