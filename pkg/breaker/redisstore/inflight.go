package redisstore

import (
	"context"
	"slices"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// What a replica knows of a breaker that Redis has not told it yet (SPEC
// R-ST13, R-ST14). The local view is Redis's last answer with, on top of
// it, this replica's outcomes that Redis has not answered: an answer is
// applied under them, never over them. Before, the view was "the last
// answer Redis gave": an answer sent before a trip undid the trip when it
// arrived after it, and a resync after a stall replaced the failures
// recorded during the stall with Redis's count from before it.

// inflight is one breaker's unanswered own evidence; e.viewMu guards it.
type inflight struct {
	next uint64 // the token of the last outcome queued
	// pending are the outcomes queued for Redis and not answered yet,
	// oldest first; each is on the local view.
	pending []ownOutcome
	// unsent are the outcomes Redis did not take (the store degraded, the
	// breaker's key refused, a call failed), oldest first: written to
	// Redis before the resync reads the breaker back.
	unsent []recJob
}

// ownOutcome is one queued outcome as the local view took it.
type ownOutcome struct {
	tok uint64
	now int64
	adm breaker.Admission
	res breaker.Result
	// failure: the policy judged it a failure, the only evidence that
	// makes a view less healthy.
	failure bool
}

// maxUnsent bounds the outcomes kept per breaker while Redis does not take
// them: far above any threshold, so a trip is never lost to the bound; the
// oldest go first (counted unsent_dropped).
const maxUnsent = 1024

// answer says what a script's answer stands for, and so how the view takes
// it.
type answer struct {
	kind answerKind
	tok  uint64 // answerRecord: the token of the outcome it answers
	// reason: answerOverride: the override's reason (breaker.ReasonForced,
	// ReasonForceClose, ReasonReset), for the view's own line when the
	// view is the store (apply).
	reason string
}

type answerKind int

const (
	// answerRecord answers one of this replica's queued outcomes: Redis's
	// state right after it, so the outcomes queued after it go on top.
	answerRecord answerKind = iota
	// answerOverride answers an operator's override: taken at once, the
	// unanswered outcomes on top.
	answerOverride
	// answerRead is any other answer (a refresh, a probe's admission, a
	// release). It cannot say which unanswered outcomes it holds, so while
	// any is unanswered it is not taken: the next record's answer brings a
	// newer state.
	answerRead
	// answerResync writes back what the view learned while Redis did not
	// answer; the view is still the store, and takes nothing.
	answerResync
)

// recordOwn puts an outcome on the local view and among the breaker's
// pending ones, in one step with the view's restores. It returns the
// outcome's token.
func (s *Store) recordOwn(ctx context.Context, e *entry, now int64, adm breaker.Admission, r breaker.Result, failure bool) (uint64, breaker.Recorded) {
	e.viewMu.Lock()
	defer e.viewMu.Unlock()
	rec, _ := s.local.Record(ctx, e.lk(), now, adm, r)
	if rec.AlreadyApplied {
		// A key this replica recorded before (R-DL11): no new evidence.
		return 0, rec
	}
	e.fl.next++
	e.fl.pending = append(e.fl.pending, ownOutcome{tok: e.fl.next, now: now, adm: adm, res: r, failure: failure})
	return e.fl.next, rec
}

// wouldReadmit reports whether snap is healthier than the local view
// (with e.viewMu held): closed or half-open over open, closed over
// half-open. Restoring it under unanswered evidence would undo that
// evidence, since the windows the evidence filled restart when the view
// closes.
func (s *Store) wouldReadmit(e *entry, snap breaker.Snapshot) bool {
	cur, err := breaker.SnapshotOf(s.local, e.lk(), e.lastNow.Load())
	if err != nil {
		return false
	}
	return severity(snap.State) < severity(cur.State)
}

// severity orders states by how little they admit.
func severity(st breaker.State) int {
	switch st {
	case breaker.Open:
		return 2
	case breaker.HalfOpen:
		return 1
	}
	return 0
}

// failurePending reports whether an unanswered outcome is a failure (with
// e.viewMu held): only then can an answer be older than the view's own
// evidence. A view whose unanswered outcomes are successes or neithers
// takes every answer, so a busy healthy or half-open breaker is never
// starved of Redis's state.
func (e *view) failurePending() bool {
	for _, o := range e.fl.pending {
		if o.failure {
			return true
		}
	}
	return false
}

// answeredUpTo drops the pending outcomes Redis has answered (with
// e.viewMu held).
func (e *view) answeredUpTo(tok uint64) {
	n := 0
	for n < len(e.fl.pending) && e.fl.pending[n].tok <= tok {
		n++
	}
	e.fl.pending = dropRange(e.fl.pending, 0, n)
}

// dropRange removes s[i:j], zeroing the slots it vacates, and lets a
// backing array go once the slice is empty. Before, the vacated slots kept
// the outcomes they held (their keys, their calls' arguments, their
// breakers) alive, and a burst's backing array stayed at its peak after
// the backlog drained: the fleet soak's memory check found owe,
// sendUnsent and recordJob's allocations grown while every backlog was 0.
func dropRange[T any](s []T, i, j int) []T {
	s = slices.Delete(s, i, j) // zeroes s[len(s):old len]
	if len(s) == 0 {
		return nil
	}
	return s
}

// notTaken keeps a record Redis did not take, to write before the resync
// reads the breaker back; a queued one leaves the pending outcomes (it is
// on the local view alone now).
func (s *Store) notTaken(e *entry, j recJob) {
	if j.op != "rec" {
		return
	}
	s.owe(e, j)
}

// owe keeps a call Redis did not take (an outcome, a lease's release) to
// send before the resync reads the breaker back (sendUnsent), bounded.
func (s *Store) owe(e *entry, j recJob) {
	e.viewMu.Lock()
	defer e.viewMu.Unlock()
	if j.tok != 0 {
		for i, o := range e.fl.pending {
			if o.tok == j.tok {
				e.fl.pending = dropRange(e.fl.pending, i, i+1)
				break
			}
		}
	}
	if len(e.fl.unsent) >= maxUnsent {
		// The oldest outcome goes; an operator's override never does (an
		// acknowledged admin change is not lost).
		i := slices.IndexFunc(e.fl.unsent, func(j recJob) bool { return !isOverride(j.op) })
		if i < 0 {
			i = 0
		}
		e.fl.unsent = dropRange(e.fl.unsent, i, i+1)
		s.count("unsent_dropped")
	}
	j.tok = 0
	e.fl.unsent = append(e.fl.unsent, j)
}

// sendUnsent writes the outcomes Redis did not take, in the order they
// were recorded, each at its own time: Redis counts them in their window
// before the resync reads the breaker back (R-ST14). The answers reach no
// view (the local one is the store until the resync ends); their
// transitions are reported and published as any script's. What a failed
// call leaves unsent stays for the next resync.
func (s *Store) sendUnsent(ctx context.Context, e *entry, now int64) error {
	// Counted before the list is taken: from here until Redis answers, the
	// outcomes are neither unsent nor answered.
	s.writingBack.Add(1)
	defer s.writingBack.Add(-1)
	e.viewMu.Lock()
	jobs := e.fl.unsent
	e.fl.unsent = nil
	e.viewMu.Unlock()
	for i, j := range jobs {
		if overrideRanOut(j, now) {
			continue
		}
		// Without emitMu during the call: a decision's probe call must not
		// wait behind the write-back.
		r, err := s.call(ctx, e, j.op, j.now, j.args)
		e.emitMu.Lock()
		_, err = s.settle(e, j.op, now, r, err, answer{kind: answerResync})
		e.emitMu.Unlock()
		if err != nil {
			e.viewMu.Lock()
			// A copy: jobs' backing array (the calls already sent in its
			// first i slots) goes.
			e.fl.unsent = append(slices.Clone(jobs[i:]), e.fl.unsent...)
			e.viewMu.Unlock()
			return err
		}
		if isOverride(j.op) {
			e.overrideSent.Store(true)
		}
	}
	return nil
}

// dropQueuedOverrides forgets the overrides queued for e: one Redis has
// answered since supersedes them.
func (s *Store) dropQueuedOverrides(e *entry) {
	e.viewMu.Lock()
	defer e.viewMu.Unlock()
	if slices.ContainsFunc(e.fl.unsent, func(j recJob) bool { return isOverride(j.op) }) {
		e.fl.unsent = slices.DeleteFunc(e.fl.unsent, func(j recJob) bool { return isOverride(j.op) })
		if len(e.fl.unsent) == 0 {
			e.fl.unsent = nil
		}
	}
}

// hasUnsent reports whether e holds outcomes Redis has not taken.
func (e *view) hasUnsent() bool {
	e.viewMu.Lock()
	defer e.viewMu.Unlock()
	return len(e.fl.unsent) > 0
}
