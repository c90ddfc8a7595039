package processor

import (
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// The decisions the access log channel can still speak for (SPEC §4a).
//
// On Envoy 1.34–1.36 the route role never sees Envoy's own local replies
// (a refused connection, a route timeout): its stream just ends, like a
// client cancel (docs/envoy.md). Envoy's gRPC access log sees them on every
// version, written when the HTTP stream completes, on its own gRPC stream,
// so it may reach fusebox before or after the ext_proc stream ends. Each
// route-role decision is therefore named by an unguessable id in dynamic
// metadata (fusebox.decision), which comes back in the entry, and kept here
// until one channel has recorded its outcome:
//
//   - an entry that arrives while the stream is live is kept; the stream
//     records from its own response if one comes, else from the entry;
//   - a stream that ends without a response waits up to access_log.wait_ms
//     for an entry, then records a neither (R-O8; wait_ms 0: at once);
//     it waits in the decision's note in the store too (meet.go), since
//     Envoy's access log stream may have gone to another replica, and an
//     entry that reached another replica first waits there for it;
//   - an entry after the outcome is a duplicate, never recorded twice.
//
// Decisions handed to the attempt role (failover) are not kept here: the
// attempt role's parked attempts answer for them (attempt.go).

// pending is a route-role decision on the replica that made it. Its lock
// guards these fields only: no store call is made while it is held
// (R-DL8). Where it is (w) moves by the replica-local table
// (lifecycle.WaitStep, decision_wait.go); whoever moves it to done records
// what the table says, and a claim through the note records whatever the
// local state (keyed, R-DL11).
type pending struct {
	mu    sync.Mutex
	st    *stream
	w     lifecycle.Wait
	entry *entryOutcome // arrived while live or parking
	timer breaker.Timer
	// note is the decision's park (from its stream's end on), wait how
	// long it waits.
	note     lifecycle.Park
	wait     time.Duration
	rewrite  parkRewrite
	rechecks int
	// held: counted in the server's held decisions while it waits
	// (held.go); given back when it ends.
	held *heldCount
}

// step applies ev to p's wait and reports what to do, and whether this
// step settled it (the first to move it to done).
func (p *pending) step(ev lifecycle.WaitEvent, how lifecycle.How) (lifecycle.WaitAct, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	was := p.w
	act := lifecycle.WaitStep(p.w, ev, how)
	p.w = act.Next
	settled := was != lifecycle.WaitDone && act.Next == lifecycle.WaitDone
	if settled {
		p.release()
	}
	return act, settled
}

// parkUnanswered: the park's last answer was unknown.
func (p *pending) parkUnanswered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rewrite.unanswered
}

// release stops p's timer and gives back its held count (p.mu held).
func (p *pending) release() {
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.held != nil {
		p.held.n.Add(-1)
		p.held = nil
	}
}

// end moves p to done outside the table (let go: another channel records);
// false when it was done already.
func (p *pending) end() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == lifecycle.WaitDone {
		return false
	}
	p.w = lifecycle.WaitDone
	p.release()
	return true
}

// decisionTable keeps pending decisions by id, and the ids recently done
// (two generations of wait_ms each) so that a late entry is told apart
// from a forged one.
type decisionTable struct {
	mu   sync.Mutex
	live map[string]*pending
	// done: ids settled lately; true when the decision was parked in its
	// note, which then says whether a later event is a duplicate or a late
	// real outcome (R-DL2).
	done    [2]map[string]bool
	rotated time.Time
	keep    time.Duration // the last generation length forget was given
	peak    int           // the live map's largest size since it was made
}

func newDecisionTable() *decisionTable {
	return &decisionTable{live: map[string]*pending{}, done: [2]map[string]bool{{}, {}}}
}

// add keeps st's decision, live.
func (t *decisionTable) add(st *stream) {
	p := &pending{st: st}
	t.mu.Lock()
	t.live[st.decisionID] = p
	t.peak = max(t.peak, len(t.live))
	t.mu.Unlock()
}

func (t *decisionTable) get(id string) *pending {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live[id]
}

// forget drops id; remember keeps it as done for an entry that may still
// come (the stream recorded one of Envoy's own endings, which Envoy also
// logs), so that the entry counts as a duplicate, not as unknown.
// keep is the generation length, one for the whole table
// (Server.forgetDecision gives it).
func (t *decisionTable) forget(id string, keep time.Duration, remember, parked bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.live, id)
	if !remember {
		return
	}
	now := time.Now()
	t.keep = keep
	t.rotate(now)
	t.done[0][id] = parked
}

func (t *decisionTable) rotate(now time.Time) {
	if now.Sub(t.rotated) > t.keep {
		t.done[1], t.done[0] = t.done[0], map[string]bool{}
		t.rotated = now
	}
}

// tidy lets an idle table go (the server's stall watch calls it): the
// done generations rotate on time, not only when the next decision ends,
// and a live map that held a burst is made again at its present size (a
// Go map never shrinks). Before, the last seconds of a burst stayed in
// memory until traffic came back (the observer soak's memory invariant).
func (t *decisionTable) tidy(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keep > 0 {
		t.rotate(now)
	}
	if t.peak > 1024 && len(t.live) < t.peak/4 {
		fresh := make(map[string]*pending, len(t.live)) // sized to what is left
		for k, v := range t.live {
			fresh[k] = v
		}
		t.live = fresh
		t.peak = len(t.live)
	}
}

// wasDone reports whether id was settled lately, and whether it was
// parked in its note then.
func (t *decisionTable) wasDone(id string) (done, parked bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pa, a := t.done[0][id]
	pb, b := t.done[1][id]
	return a || b, pa || pb
}

// len is how many decisions are kept (tests, bounds).
func (t *decisionTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}

// forgetDecision settles id in the decision table (decisionTable.forget)
// for access_log.wait_ms generations: the time an entry takes to come
// after its request ended, however long the decision waited before it
// settled. Each caller gave its own length before, and the table took the
// last one for every id: a decision that waited decision_wait_sec (300 s)
// once stretched every id's memory to 10 minutes. A parked decision needs
// no longer: an entry the table no longer knows goes to the decision's
// note (Server.entry).
func (s *Server) forgetDecision(id string, remember, parked bool) {
	s.decisions.forget(id, s.cfg.Load().AccessLogWait, remember, parked)
}

// kept is how many decisions the table still holds: live, and done but
// remembered for a late entry.
func (t *decisionTable) kept() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live) + len(t.done[0]) + len(t.done[1])
}

// DecisionsKept is how many decisions the server still holds in memory:
// those awaiting an outcome and those settled within the last two
// access_log.wait_ms generations (remembered so that a late entry counts
// as a duplicate). A quiet server lets all of them go within twice
// wait_ms; the soak waits for that before it measures what a load left
// behind, and fails if it does not happen.
func (s *Server) DecisionsKept() int { return s.decisions.kept() }
