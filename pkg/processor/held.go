package processor

import (
	"math"
	"runtime/debug"
	"sync/atomic"
)

// What a replica holds in memory for decisions and attempts that wait in
// their note (R-DL3, R-X7), and its bound (#49).
//
// A decision waiting in its note is held here with its stream and a timer
// for its whole wait: decision_wait_sec (300 s) in the observer profile,
// where the observer that settles it is often on another replica, which
// this replica never hears of. About 1.3 KiB each: some 200 MB per replica
// at 1,000 decisions a second. Past the bound a decision parked in its note
// is not held: the note keeps it, and every channel on every replica still
// settles it there (an entry, the observer, a late outcome, R-DL2). What it
// costs: no expiry frees its probe slot early (the slot's lease ends at
// probe_timeout_ms), and no neither is counted for it.
//
// The same holds for attempts parked in their note (meet.go): past the
// parked map's bound an attempt parks in the note only, so a flood of parks,
// even of real decisions someone had fusebox make, never turns the genuine
// connection errors after it into neithers; the retry or entry that comes
// claims them in the note. What a flood can still cost: note space (2^17
// notes on memory, keys in Redis; a full table turns a park into a neither,
// counted), and the probe slots of unheld parks until their leases end.

// heldBytes is what one held decision costs (measured by
// TestHeldDecisionsAreBounded: the pending, its stream and timer).
const heldBytes = 1400

// heldBound is how many waiting decisions a replica holds: a sixteenth of
// its memory limit (GOMEMLIMIT, or the container's as mainlib sets it) over
// heldBytes, within [4096, 2^16]; 2^16 (about 90 MB) without a limit.
func heldBound() int64 {
	limit := debug.SetMemoryLimit(-1)
	if limit <= 0 || limit == math.MaxInt64 {
		return 1 << 16
	}
	return min(max(limit/16/heldBytes, 4096), 1<<16)
}

// heldCount counts the decisions held while they wait.
type heldCount struct {
	n   atomic.Int64
	max int64
}

// take counts one more held decision; false past the bound.
func (h *heldCount) take() bool {
	if h.n.Add(1) > h.max {
		h.n.Add(-1)
		return false
	}
	return true
}
