package redisstore

import (
	"context"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// settleLocal writes back what e's local view learned while Redis did not
// answer for it and its outcomes and overrides (sent before, in order) do
// not carry: an open, or a Retry-After block. A forced open is left out
// when the queue carried an operator's override: that override wrote
// what the operator said (the view's force is the override's own).
func (s *Store) settleLocal(ctx context.Context, e *entry, now int64) error {
	snap, err := breaker.SnapshotOf(s.local, e.lk(), now)
	if err != nil {
		return nil
	}
	if e.overrideSent.Swap(false) && snap.Forced {
		return nil
	}
	return s.writeBackSnap(ctx, e, now, snap)
}

// writeBack writes an open (or forced open) the local view learned while
// Redis was unreachable; the script keeps the later of two opens.
func (s *Store) writeBackSnap(ctx context.Context, e *entry, now int64, snap breaker.Snapshot) error {
	if snap.State != breaker.Open && snap.BlockedUntil <= now {
		return nil
	}
	live := snap.State == breaker.Open
	fu := int64(0)
	if snap.Forced {
		fu = snap.ForcedUntil / ms
	}
	ou := snap.OpenUntil / ms
	if !live {
		ou = 0
	}
	// The result must not reach the local view, which is still the store
	// until the resync ends (answerResync); the transitions the merge makes
	// in Redis (the open written back, a due one on the way) are reported
	// and published as any script's. Before, they were dropped: the shared
	// chain of transitions had a gap (half_open, then open->half_open).
	// The call is made without emitMu: a decision's probe call on this
	// breaker must not wait behind a write-back (the lock orders reports,
	// not calls).
	r, err := s.call(ctx, e, "merge", now, args{
		{"forced", snap.Forced && live}, {"forced_until", fu}, {"opened_at", snap.OpenedAt / ms},
		{"open_until", ou}, {"reopens", snap.Reopens}, {"reason", snap.Reason}, {"blocked_in", blockedIn(snap.BlockedUntil, now)},
	})
	if err != nil {
		s.count("merge")
		return err
	}
	e.emitMu.Lock()
	defer e.emitMu.Unlock()
	_, err = s.settle(e, "merge", now, r, nil, answer{kind: answerResync})
	return err
}

// blockedIn is what is left of a Retry-After block at now, in ms (0 none):
// a provider's deadline travels as a duration and becomes Redis's own time
// in the script (R-H8).
func blockedIn(until, now int64) int64 {
	if until <= now {
		return 0
	}
	return max((until-now)/ms, 1)
}
