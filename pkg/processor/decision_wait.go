package processor

import (
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
)

// A route-role decision on the replica that made it, from its stream's end
// to its settling: every event goes through the replica-local table
// (lifecycle.WaitStep, docs/decisions.md), and this file does what the
// table says — record, hold, write the park again, read the note, apply
// the expiry. No lock is held across a store call (R-DL8).

// entryForStream applies an entry to a route-role decision (R-AL3).
func (s *Server) entryForStream(p *pending, id string, out entryOutcome) string {
	p.mu.Lock()
	st := p.st
	if out.cluster != "" && out.cluster != st.chosen.Cluster {
		p.mu.Unlock()
		// A client cannot steer an outcome onto another route (R-AL4).
		return EntryClusterMismatch
	}
	w := p.w
	switch w {
	case lifecycle.WaitLive, lifecycle.WaitParking:
		// The stream may still see its own response, or is writing its
		// note: it decides at its end with this entry.
		if p.entry == nil {
			p.entry = &out
		}
		p.mu.Unlock()
		return EntryRecorded
	case lifecycle.WaitDone:
		p.mu.Unlock()
		return EntryDuplicate
	}
	p.mu.Unlock()
	if w == lifecycle.WaitAlone || w == lifecycle.WaitGone {
		// Held here alone: the note never took the park; the entry is the
		// outcome, recorded here and keyed (R-DL11).
		st.waitEvent(p, lifecycle.WLocal, lifecycle.HowNone, nil, &out)
		return EntryRecorded
	}
	// In its note, where an entry that reached another replica may claim
	// it too; whoever claims records.
	switch act := s.meet.notes.Run(id, nil, out.noteOp()); act.How {
	case lifecycle.HowEntry:
		if s.entryClaimHook != nil {
			s.entryClaimHook()
		}
		// The note's claim is the authority: a recheck that read the note
		// just after it may have let the decision go first, and this entry
		// still records what it claimed (row W21).
		st.waitEventLate(p, lifecycle.WClaim, act.How, &out, nil, act.Late)
	case lifecycle.HowUnreachable, lifecycle.HowFailed:
		st.waitEvent(p, lifecycle.WLocal, act.How, nil, &out)
	case lifecycle.HowMismatch:
		return EntryClusterMismatch
	default:
		return EntryDuplicate // claimed elsewhere meanwhile
	}
	return EntryRecorded
}

// recordEntry records what an entry says for st's decision.
func (st *stream) recordEntry(out entryOutcome) {
	st.traceChannel = tracing.ChannelAccessLog
	if st.traceRef == "" {
		st.traceRef = out.trace
	}
	st.reportClusterNotFound(out.res)
	st.record(out.res, st.now())
}

// finishDecision ends a route-role stream's decision (called by finish,
// with no outcome recorded by the stream's own response when noResponse):
// an entry that came first is recorded now; otherwise the decision waits
// in its note (decisionWait), then is a neither (R-O8).
//
// A stream that broke after its response started is a neither (R-O9), and
// what broke it is Envoy's to say (R-AL4): the stream ends the same way
// whether the client went away or one of Envoy's timers cut the answer.
// An entry that reached this replica first (Envoy writes the access log
// before it destroys the filters) labels it at once: cut_mid_answer,
// client_cancel, stream_error. Otherwise it waits on this replica for the
// entry (labelwait.go), never in the note: a neither charges nothing, so
// no other replica needs to see it. (Waiting in the note was tried: the
// fleet soak then counted 9 neithers past the providers' tallies in CI,
// and it was taken out; #52's closing note.)
func (st *stream) finishDecision(noResponse bool) {
	s := st.s
	p := s.decisions.get(st.decisionID)
	if p == nil {
		if !st.recorded {
			st.recordNeither()
		}
		return
	}
	wait := st.decisionWait(noResponse)
	broken := !noResponse && !st.recorded
	p.mu.Lock()
	entry := p.entry
	if broken && entry != nil && entry.res.Kind == breaker.KindNeither {
		p.w = lifecycle.WaitDone
		p.mu.Unlock()
		st.recordEntry(*entry)
		s.forgetDecision(st.decisionID, true, false)
		return
	}
	if st.recorded || !noResponse || wait == 0 || entry != nil && !st.rt.Envoy.Observer {
		p.w = lifecycle.WaitDone
		p.mu.Unlock()
		switch {
		case st.recorded:
		case noResponse && entry != nil:
			st.recordEntry(*entry)
		case broken:
			st.recordBroken()
		default:
			st.recordNeither()
		}
		// Envoy logs an entry only for its own endings (the shipped
		// filter): remember the decision only when the response showed one.
		s.forgetDecision(st.decisionID, st.envoyEnded || noResponse, false)
		return
	}
	p.w = lifecycle.WaitLive
	p.wait = wait
	p.note = lifecycle.Park{Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
		RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease, Start: st.startNs}
	p.mu.Unlock()
	st.waitEvent(p, lifecycle.WEnd, lifecycle.HowNone, nil, nil)
}

// decisionWait is how long a decision whose stream ended with no response
// waits in its note: for its response to begin on the observer when the
// stream closed early (Envoy 1.37+ closes it after the last request reply,
// R-DL3: decision_wait_sec), else for Envoy's entry (access_log.wait_ms).
func (st *stream) decisionWait(noResponse bool) time.Duration {
	if st.rt.Envoy.Observer && noResponse && !st.recorded {
		return max(st.rt.DecisionWait, st.rt.AccessLogWait)
	}
	return st.rt.AccessLogWait
}

// parkOp is the decision's park as a note operation: its id is the
// decision's start, so the park sent again after an unknown answer gets
// the answer it got (lifecycle.Note.Claims).
func (p *pending) parkOp() lifecycle.Op {
	return lifecycle.Op{ID: lifecycle.ParkID(&p.note), Park: &p.note}
}

// writePark writes the decision's note (the first park, or a repark) and
// applies the answer: whether or not a channel stream is connected now
// (Envoy opens its access log stream at its first entry), and on any
// replica (an entry or the observer that came first to another one waits
// in the note).
func (st *stream) writePark(p *pending) {
	act := st.s.meet.notes.Run(st.decisionID, nil, p.parkOp())
	p.mu.Lock()
	p.rewrite.unanswered = lifecycle.Unknown(act.How)
	p.mu.Unlock()
	var claimed *entryOutcome
	if act.How == lifecycle.HowEntry {
		out := fromEntry(act.Res)
		claimed = &out
	}
	st.waitEvent(p, lifecycle.WAnswer, act.How, claimed, nil)
}

// waitEvent applies ev (with the note's answer how) to the decision's
// wait and does what the replica-local table says. claimed is the outcome
// the note gave; local what reached this replica.
func (st *stream) waitEvent(p *pending, ev lifecycle.WaitEvent, how lifecycle.How, claimed, local *entryOutcome) {
	st.waitEventLate(p, ev, how, claimed, local, false)
}

// waitEventLate is waitEvent for a claim the note made of an expired park
// (noteLate): recorded without the slot.
func (st *stream) waitEventLate(p *pending, ev lifecycle.WaitEvent, how lifecycle.How, claimed, local *entryOutcome, noteLate bool) {
	s := st.s
	id := st.decisionID
	if ev == lifecycle.WAnswer && how == lifecycle.HowParked {
		p.mu.Lock()
		first := p.w == lifecycle.WaitParking
		p.mu.Unlock()
		if first && !s.held.take() {
			// Past the bound (held.go): the note keeps it, and every
			// channel on every replica settles it there; this replica
			// lets it go, after giving the note an entry that reached it
			// while the stream ran.
			s.metrics.DecisionEvents.WithLabelValues("park", "not_held").Inc()
			st.letGo(p)
			return
		}
	}
	act, settled := p.step(ev, how)
	switch act.Rec {
	case lifecycle.RecClaim, lifecycle.RecLocal:
		out := claimed
		if act.Rec == lifecycle.RecLocal {
			out = local
		}
		rs := st
		if out != nil && (act.Late || noteLate || st.recorded) {
			// Its neither was recorded (its slot freed): the real outcome
			// is recorded without the slot, on a stream of its own.
			if rs = s.streamFromNote(id, &p.note); rs != nil {
				rs.adm.Route.Lease, rs.adm.Fleet.Lease = 0, 0
			}
		}
		if out != nil && rs != nil {
			rs.recordEntry(*out)
			if ev == lifecycle.WAnswer {
				s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
			}
		}
	case lifecycle.RecNeither:
		st.recordNeitherExpired()
	}
	if act.Next == lifecycle.WaitParking {
		st.writePark(p)
		return
	}
	if act.Hold {
		p.mu.Lock()
		if act.Next != lifecycle.WaitDone {
			p.timer = s.timers.after(s.clock, p.wait, func() { st.waitEvent(p, lifecycle.WExpire, lifecycle.HowNone, nil, nil) })
			if act.Next == lifecycle.WaitNote && ev == lifecycle.WAnswer && how == lifecycle.HowParked && p.held == nil {
				p.held = &s.held // taken above
			}
		}
		p.mu.Unlock()
	}
	if act.Recheck {
		st.recheckDecision(p)
	}
	if act.Repark || p.parkUnanswered() && act.Next != lifecycle.WaitParking {
		st.reparkDecision(p)
	}
	if act.AskExpire {
		if ev == lifecycle.WExpired {
			s.timers.after(s.clock, lifecycle.ResendEvery, func() { st.askExpire(p) })
		} else {
			st.askExpire(p)
		}
	}
	if ev == lifecycle.WAnswer && act.Hold {
		st.keptEntry(p)
	}
	if settled {
		s.forgetDecision(id, true, true)
	}
}

// keptEntry gives the note an entry that reached this replica while the
// stream ran (the observer profile parks with it): it claims the parked
// decision unless the observer did. Held here alone, the entry is the
// outcome.
func (st *stream) keptEntry(p *pending) {
	p.mu.Lock()
	entry, w := p.entry, p.w
	p.mu.Unlock()
	if entry == nil {
		return
	}
	if w == lifecycle.WaitAlone {
		st.waitEvent(p, lifecycle.WLocal, lifecycle.HowNone, nil, entry)
		return
	}
	switch a := st.s.meet.notes.Run(st.decisionID, nil, entry.noteOp()); a.How {
	case lifecycle.HowEntry:
		st.waitEvent(p, lifecycle.WClaim, a.How, entry, nil)
	case lifecycle.HowUnreachable, lifecycle.HowFailed:
		st.waitEvent(p, lifecycle.WLocal, a.How, nil, entry)
	case lifecycle.HowByObserver, lifecycle.HowDuplicate:
		if p.end() {
			st.s.forgetDecision(st.decisionID, true, true)
		}
	}
}

// letGo ends a decision parked in its note that this replica does not
// hold (past the bound).
func (st *stream) letGo(p *pending) {
	s := st.s
	p.mu.Lock()
	entry := p.entry
	p.mu.Unlock()
	if entry != nil {
		if a := s.meet.notes.Run(st.decisionID, nil, entry.noteOp()); a.How == lifecycle.HowEntry || lifecycle.Unknown(a.How) {
			if p.end() {
				st.recordEntry(*entry)
			}
			s.forgetDecision(st.decisionID, true, true)
			return
		}
	}
	if p.end() {
		s.forgetDecision(st.decisionID, true, true)
	}
}

// reparkDecision writes the park again, every lifecycle.ResendEvery, while the
// decision waits here alone or its park's answer is unknown (R-DL12): an
// entry or an observer that reaches another replica after the blip then
// meets it, and one that reached the note meanwhile is claimed. It gives up
// when the decision's record key ends (no outcome can come any more).
func (st *stream) reparkDecision(p *pending) {
	s := st.s
	p.mu.Lock()
	start := p.rewrite.start(s.clock.Now().UnixNano(), st.keyLife())
	p.mu.Unlock()
	if !start {
		return
	}
	s.timers.after(s.clock, lifecycle.ResendEvery, func() {
		p.mu.Lock()
		write, giveUp := p.rewrite.fire(s.clock.Now().UnixNano(), p.w == lifecycle.WaitAlone || p.w == lifecycle.WaitGone)
		p.mu.Unlock()
		switch {
		case giveUp:
			st.waitEvent(p, lifecycle.WGiveUp, lifecycle.HowNone, nil, nil)
		case write:
			st.writePark(p)
		}
	})
}

// parkRewrite is a held party's park being written again (R-DL12); its
// owner's lock guards it.
type parkRewrite struct {
	// unanswered: the park's last answer was unknown: it is written again
	// whatever the party's state (its answer may name an earlier attempt
	// it claimed), until giveUp (unix ns).
	unanswered bool
	pending    bool // a rewrite is scheduled
	giveUp     int64
}

// start reports whether a rewrite is to be scheduled (none is); life is
// how long the party's record key lives.
func (r *parkRewrite) start(now int64, life time.Duration) bool {
	if r.pending {
		return false
	}
	r.pending = true
	if r.giveUp == 0 {
		r.giveUp = now + int64(life)
	}
	return true
}

// fire is the scheduled rewrite's turn: write the park again, or give up
// (its key's life ended), or neither (answered, and not waiting alone).
func (r *parkRewrite) fire(now int64, alone bool) (write, giveUp bool) {
	r.pending = false
	if !r.unanswered && !alone {
		return false, false
	}
	if now >= r.giveUp {
		r.unanswered = false
		return false, true
	}
	return true, false
}

// askExpire applies the decision's expiry to its note.
func (st *stream) askExpire(p *pending) {
	p.mu.Lock()
	w := p.w
	p.mu.Unlock()
	if how, ok := st.s.meet.expireOp(st.decisionID, w, &p.note); ok {
		st.waitEvent(p, lifecycle.WExpired, how, nil, nil)
	}
}

// recheckAfter is when a decision held here while it waits in its note
// reads the note again: the observer that settles it is often on another
// replica (the observer profile), which records it in the note and never
// tells this one. Three reads at most, so a decision costs at most three
// note operations more, and one settled elsewhere is let go within 5 s,
// 30 s or 2 min of its park instead of decision_wait_sec (300 s).
var recheckAfter = [...]time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute}

// recheckDecision reads the note of a decision held here at its next
// recheckAfter (unless its wait ends first): a decision another replica's
// observer or entry settled is let go (held.go's count given back); one
// still parked waits for the next read or its expiry. Before (#49's
// figure), a replica in the observer profile held every decision the other
// replica observed for its whole wait: 65,536 held, its bound, after 5
// minutes at 1,000 decisions a second.
func (st *stream) recheckDecision(p *pending) {
	s := st.s
	p.mu.Lock()
	i := p.rechecks
	p.rechecks++
	wait := p.wait
	p.mu.Unlock()
	if i >= len(recheckAfter) || recheckAfter[i] >= wait {
		return
	}
	delay := recheckAfter[i]
	if i > 0 {
		delay -= recheckAfter[i-1]
	}
	s.timers.after(s.clock, delay, func() {
		p.mu.Lock()
		inNote := p.w == lifecycle.WaitNote
		p.mu.Unlock()
		if !inNote {
			return
		}
		// A park of what is parked already reads the note: Duplicate
		// while it still waits, ByObserver or Entry once a channel came.
		// Only a note that exists: a settled note lives a park time (5 s)
		// and then is gone, and a park then would make a fresh one that
		// its expiry would count as a neither. A note that is gone leaves
		// the decision to its expiry, as before the rechecks.
		act := s.meet.notes.RunExisting(st.decisionID, p.parkOp())
		if act.How == lifecycle.HowByObserver {
			s.metrics.DecisionEvents.WithLabelValues("recheck", "settled_elsewhere").Inc()
		}
		var claimed *entryOutcome
		if act.How == lifecycle.HowEntry {
			out := fromEntry(act.Res)
			claimed = &out
		}
		st.waitEvent(p, lifecycle.WAnswer, act.How, claimed, nil)
	})
}

// keyLife is how long the decision's record key lives (keyRecord): no
// outcome can arrive after it.
func (st *stream) keyLife() time.Duration {
	if st.rt == nil {
		return lifecycle.RecordKeyLife(0, 0)
	}
	return lifecycle.RecordKeyLife(st.rt.DecisionWait, st.rt.AccessLogWait)
}
