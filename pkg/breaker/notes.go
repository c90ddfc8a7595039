package breaker

import (
	"bytes"
	"errors"
	"sync"
	"time"
)

// Notes are the store's one shared memory besides breakers: small values
// that every replica reaches for a short time, named by a string. They let
// the attempts of one request meet when Envoy sends attempt k and attempt
// k+1 to different replicas (SPEC R-X7): whoever changes a note does so by
// compare-and-set, so exactly one replica claims what it holds.
//
// Store.SwapNote sets name to next when its current value is prev (nil:
// the note does not exist; next nil: delete it), for ttl, and reports ok.
// Otherwise it changes nothing and returns the current value, so a caller
// that guessed wrong retries with what it was told.

// ErrNotesFull is returned when a store keeps as many notes as it may.
var ErrNotesFull = errors.New("breaker: note table full")

// MaxNoteBytes bounds one note's value.
const MaxNoteBytes = 4 << 10

// NoteTable is the in-process note store (the memory store's, and the
// Redis store's while Redis does not answer). Expiry uses the wall clock:
// it only reclaims memory; callers decide what a note means by its content.
type NoteTable struct {
	mu     sync.Mutex
	m      map[string]note
	max    int
	pruned time.Time
	now    func() time.Time // time.Now; tests set it
	peak   int              // the map's largest size since it was made
}

type note struct {
	v       []byte
	expires time.Time
}

// NewNoteTable returns a table holding at most max live notes.
func NewNoteTable(max int) *NoteTable {
	return &NoteTable{m: map[string]note{}, max: max, now: time.Now}
}

// Swap implements Store.SwapNote.
func (t *NoteTable) Swap(name string, prev, next []byte, ttl time.Duration) ([]byte, bool, error) {
	if len(next) > MaxNoteBytes {
		return nil, false, errors.New("breaker: note too large")
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	// Expired notes go once a second, full or not. Before, they went only
	// when the table was full: every request of the observer profile left
	// its note behind, and memory grew to the table's bound (2^17 notes,
	// tens of MiB) before anything was reclaimed (the observer soak's
	// memory invariant, once its baseline no longer held envoysim's
	// closing streams).
	t.prune(now)
	cur, ok := t.m[name]
	if ok && !now.Before(cur.expires) {
		delete(t.m, name)
		ok = false
	}
	if ok != (prev != nil) || ok && !bytes.Equal(cur.v, prev) {
		if !ok {
			return nil, false, nil
		}
		return bytes.Clone(cur.v), false, nil
	}
	if next == nil {
		delete(t.m, name)
		return nil, true, nil
	}
	if !ok && len(t.m) >= t.max {
		t.prune(now)
		if len(t.m) >= t.max {
			return nil, false, ErrNotesFull
		}
	}
	t.m[name] = note{v: bytes.Clone(next), expires: now.Add(ttl)}
	t.peak = max(t.peak, len(t.m))
	return nil, true, nil
}

// Sweep drops expired notes (the memory store's sweep calls it, so that a
// table nobody writes to any more, after a burst, empties too).
func (t *NoteTable) Sweep() {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prune(now)
}

// prune drops expired notes, at most once a second (a full table of live
// notes is not scanned on every call).
func (t *NoteTable) prune(now time.Time) {
	if now.Sub(t.pruned) < time.Second {
		return
	}
	t.pruned = now
	for k, n := range t.m {
		if !now.Before(n.expires) {
			delete(t.m, k)
		}
	}
	// A Go map never shrinks: one that held a burst is made again at its
	// present size, so memory returns once the burst's notes expire
	// (and an emptied table of any size starts again empty: the soak's
	// heap after the load held 110 KiB of buckets for no note).
	if len(t.m) < t.peak/4 && (t.peak > 1024 || len(t.m) == 0) {
		fresh := make(map[string]note, len(t.m)) // sized to what is left
		for k, v := range t.m {
			fresh[k] = v
		}
		t.m = fresh
		t.peak = len(t.m)
	}
}

// Len reports how many notes are kept (tests, bounds).
func (t *NoteTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
