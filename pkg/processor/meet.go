package processor

import (
	"context"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
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

// attemptNote is the note of one decision. Fields may coexist: a later
// attempt's arrival and an early access log entry wait for a parking.
type attemptNote struct {
	Parked *parkedNote `json:"p,omitempty"`
	Later  int         `json:"l,omitempty"` // the latest attempt seen arriving
	Entry  *entryNote  `json:"e,omitempty"` // an access log entry that came first
	// Obs: the observer role took the decision's response (observe.go):
	// it records; a later park or entry of the decision records nothing.
	Obs bool `json:"o,omitempty"`
	// Done: a route-role decision (N 0) was recorded from its parking (an
	// entry, or a neither at its end): an observer that comes later
	// records nothing.
	Done bool `json:"x,omitempty"`
}

// parkedNote is a parked attempt, or a route-role decision waiting for
// its access log entry (N 0: any attempt count): enough to record it on
// any replica.
type parkedNote struct {
	N          int    `json:"n"`
	Gateway    string `json:"g"`
	Route      string `json:"r"`
	Cluster    string `json:"c"`
	RouteGen   uint64 `json:"rg"`
	RouteLease uint64 `json:"rl,omitempty"`
	FleetGen   uint64 `json:"fg,omitempty"`
	FleetLease uint64 `json:"fl,omitempty"`
	Start      int64  `json:"s"` // when the attempt began (ns, the parking replica's clock)
}

type entryNote struct {
	Res     breaker.Result `json:"res"`
	Cluster string         `json:"c,omitempty"`
	Attempt uint32         `json:"a,omitempty"`
}

func (e *entryNote) outcome() entryOutcome {
	return entryOutcome{res: e.Res, cluster: e.Cluster, attempt: e.Attempt}
}

func (o entryOutcome) matchesNote(p *parkedNote) bool {
	return (o.attempt == 0 || p.N == 0 || int(o.attempt) == p.N) && (o.cluster == "" || o.cluster == p.Cluster)
}

func (n *attemptNote) empty() bool {
	return n.Parked == nil && n.Later == 0 && n.Entry == nil && !n.Obs && !n.Done
}

// What an operation on a note did.
type meetHow uint8

const (
	meetNone         meetHow = iota
	meetParked               // the attempt waits in the note
	meetConnErr              // claimed: Envoy retried it
	meetEntry                // claimed: the access log entry says what happened
	meetNeither              // claimed: its park time ended
	meetEarly                // an entry for no parked attempt, kept in the note
	meetMismatch             // an entry that names another cluster or attempt
	meetFailed               // the store refused (full, forged): settled here
	meetObserved             // the observer claimed the parked decision: it records
	meetObserveFirst         // the observer came before the park: it records
	meetByObserver           // a park or entry after the observer: nothing to record
)

type meetAct struct {
	how   meetHow
	claim *parkedNote // the attempt to record (how is connErr, entry, neither)
	res   entryOutcome
	// older is an earlier attempt of the request found parked by a park:
	// Envoy retried it.
	older *parkedNote
}

type meetOp struct {
	park   *parkedNote // park (or expire, with expire set)
	expire bool
	arrive int
	entry  *entryOutcome
	// observe: the observer role saw the decision's response begin.
	observe bool
}

// step is the note's state machine: the next note and what to do.
func step(cur attemptNote, op meetOp) (attemptNote, meetAct) {
	switch {
	case op.observe:
		if cur.Done {
			return cur, meetAct{how: meetByObserver} // settled already: nothing to record
		}
		if q := cur.Parked; q != nil && q.N == 0 {
			cur.Parked, cur.Obs = nil, true
			return cur, meetAct{how: meetObserved, claim: q}
		}
		cur.Obs = true
		return cur, meetAct{how: meetObserveFirst}
	case cur.Obs && (op.park != nil && op.park.N == 0 && !op.expire || op.entry != nil):
		// The observer records this decision's response.
		return cur, meetAct{how: meetByObserver}
	case op.expire:
		if cur.Parked != nil && *cur.Parked == *op.park {
			cur.Parked = nil
			cur.Done = op.park.N == 0
			return cur, meetAct{how: meetNeither, claim: op.park}
		}
		return cur, meetAct{}
	case op.park != nil:
		p := op.park
		if cur.Later > p.N {
			cur.Later = 0
			return cur, meetAct{how: meetConnErr, claim: p}
		}
		if cur.Entry != nil && cur.Entry.outcome().matchesNote(p) {
			out := cur.Entry.outcome()
			cur.Entry = nil
			cur.Done = p.N == 0
			return cur, meetAct{how: meetEntry, claim: p, res: out}
		}
		act := meetAct{how: meetParked}
		if q := cur.Parked; q != nil && q.N < p.N {
			act.older = q
		}
		cur.Parked = p
		return cur, act
	case op.arrive > 0:
		if q := cur.Parked; q != nil && q.N < op.arrive {
			cur.Parked = nil
			return cur, meetAct{how: meetConnErr, claim: q}
		}
		cur.Later = max(cur.Later, op.arrive)
		return cur, meetAct{}
	case op.entry != nil:
		if q := cur.Parked; q != nil {
			if !op.entry.matchesNote(q) {
				return cur, meetAct{how: meetMismatch}
			}
			cur.Parked = nil
			cur.Done = q.N == 0
			return cur, meetAct{how: meetEntry, claim: q, res: *op.entry}
		}
		if cur.Entry == nil {
			cur.Entry = &entryNote{Res: op.entry.res, Cluster: op.entry.cluster, Attempt: op.entry.attempt}
		}
		return cur, meetAct{how: meetEarly}
	}
	return cur, meetAct{}
}

// meetings runs note operations and keeps this replica's parked attempts
// (their streams and park timers).
type meetings struct {
	s   *Server
	ttl time.Duration
	max int

	mu   sync.Mutex
	here map[string]*parkedHere
}

type parkedHere struct {
	st    *stream
	note  parkedNote
	timer *time.Timer
}

func newMeetings(s *Server) *meetings {
	return &meetings{s: s, ttl: parkFor, max: 10000, here: map[string]*parkedHere{}}
}

func noteName(decision string) string { return "a:" + decision }

// run applies op to decision's note by compare-and-set, starting from the
// guess prev (nil: no note), and returns what it did.
func (m *meetings) run(decision string, prev []byte, op meetOp) meetAct {
	var cur attemptNote
	if prev != nil {
		_ = decodeAttemptNote(prev, &cur)
	}
	for range 5 {
		next, act := step(cur, op)
		raw := next.encode()
		// The note lives a park time past its last change, and the store
		// call is bounded by the store's op timeout.
		got, ok, err := m.s.store.SwapNote(context.Background(), noteName(decision), prev, raw, m.ttl+time.Second)
		if err != nil {
			return meetAct{how: meetFailed}
		}
		if ok {
			return act
		}
		prev, cur = got, attemptNote{}
		if got != nil && decodeAttemptNote(got, &cur) != nil {
			cur = attemptNote{} // not ours: overwritten by the next try
		}
	}
	m.s.metrics.InternalErrors.WithLabelValues("attempt_note").Inc()
	return meetAct{how: meetFailed}
}

// park keeps st, which ended before any response headers, until its
// request's next attempt, an access log entry or the park time.
func (m *meetings) park(a *attemptStream) {
	st := a.j
	if st.decisionID == "" {
		st.recordNeither()
		return
	}
	p := parkedNote{N: a.n, Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
		RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease, Start: st.startNs}
	m.mu.Lock()
	if len(m.here) >= m.max {
		m.mu.Unlock()
		st.recordNeither()
		return
	}
	m.mu.Unlock()
	act := m.run(st.decisionID, nil, meetOp{park: &p})
	if act.older != nil {
		m.settle(st.decisionID, act.older, meetConnErr, entryOutcome{})
	}
	switch act.how {
	case meetParked:
		h := &parkedHere{st: st, note: p}
		id := st.decisionID
		m.mu.Lock()
		if old := m.here[id]; old != nil {
			old.timer.Stop()
		}
		m.here[id] = h
		h.timer = time.AfterFunc(m.ttl, func() { m.expire(id, h) })
		m.mu.Unlock()
	case meetConnErr:
		st.recordConnError()
	case meetEntry:
		st.recordEntry(act.res)
		st.s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
	default:
		st.recordNeither()
	}
}

// expire ends h's park: a neither, unless another attempt or an entry
// claimed it first (on any replica).
func (m *meetings) expire(id string, h *parkedHere) {
	m.mu.Lock()
	if m.here[id] == h {
		delete(m.here, id)
	}
	m.mu.Unlock()
	cur := attemptNote{Parked: &h.note}
	act := m.run(id, cur.encode(), meetOp{park: &h.note, expire: true})
	if act.how == meetNeither || act.how == meetFailed {
		h.st.recordNeither()
	}
}

// arrived tells the note that attempt n (> 1) of decision began: a parked
// earlier attempt was retried. It runs off the attempt's request path (a
// slow store must not delay it).
func (m *meetings) arrived(decision string, n int) {
	if decision == "" || n <= 1 {
		return
	}
	go func() {
		act := m.run(decision, nil, meetOp{arrive: n})
		if act.how == meetConnErr {
			m.settle(decision, act.claim, meetConnErr, entryOutcome{})
		}
	}()
}

// entry applies an access log entry to decision's note (R-AL5). ok is
// false when no attempt was parked yet (the entry waits in the note).
func (m *meetings) entry(decision string, out entryOutcome) (string, bool) {
	act := m.run(decision, nil, meetOp{entry: &out})
	switch act.how {
	case meetEntry:
		m.settle(decision, act.claim, meetEntry, act.res)
		return EntryRecorded, true
	case meetMismatch:
		return EntryClusterMismatch, true
	}
	return "", false
}

// settle records a claimed attempt: with its own stream when it is parked
// on this replica, else with one rebuilt from the note.
func (m *meetings) settle(decision string, p *parkedNote, how meetHow, out entryOutcome) {
	m.mu.Lock()
	h := m.here[decision]
	var st *stream
	if h != nil && h.note == *p {
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
	switch how {
	case meetConnErr:
		st.recordConnError()
	case meetEntry:
		st.recordEntry(out)
	default:
		st.recordNeither()
	}
}

// streamFromNote rebuilds what recording a parked attempt needs on a
// replica that did not serve it.
func (s *Server) streamFromNote(decision string, p *parkedNote) *stream {
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
	st.startNs, st.decisionID = p.Start, decision
	st.tracked = !st.target.Peek(context.Background(), s.store, st.now()).Off
	return st
}

// len reports how many attempts are parked on this replica (tests).
func (m *meetings) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.here)
}
