package breaker

import (
	"context"
	"errors"
	"time"
)

// Store is the one boundary every breaker operation crosses; nothing
// outside a store touches breaker state. It is keyed by breaker ID and has
// a context and an error on every operation a remote store performs, so a
// shared (Redis) store can replace the memory one without changing callers,
// the way envoyproxy/ratelimit keeps its cache behind one interface:
//   - Install puts a configuration's breakers and policies in force, once
//     per config load (R-P9, R-P11); outcomes carry no policy;
//   - a decision reads local state only (Peek), plus, for a half-open
//     route, taking a probe slot (Acquire: one bounded call to a shared
//     store, which keeps the bound global);
//   - recording an outcome is one call (Record), one atomic script in a
//     shared store, off the request's critical path;
//   - overrides and the sweep go through the store so that they reach
//     every replica.
//
// Every Store passes the contract suite in package storetest.
type Store interface {
	// Install makes specs the set of breakers that exist: new ones are
	// created closed, kept ones keep their state and adopt the new policy
	// (the next outcome is judged with it), and breakers not in specs are
	// removed. It returns the keys of specs, in order, and the IDs removed.
	Install(ctx context.Context, now int64, specs []Spec) ([]Key, []ID, error)
	// Peek answers from local state only and takes nothing (R-D2, R-ST2):
	// it is not a remote operation, so it has no error. A breaker that is
	// not installed reads as healthy.
	Peek(ctx context.Context, k Key, now int64) Verdict
	// Acquire admits one request: on a half-open prod breaker it takes a
	// probe slot and fails when every slot is taken, unless force is set
	// (try_all and the floor send requests to unhealthy routes anyway; they
	// hold no slot). Shadow and off breakers always admit (R-M4).
	Acquire(ctx context.Context, k Key, now int64, force bool) (Admission, bool, error)
	// Release frees a probe slot without recording anything.
	Release(ctx context.Context, k Key, adm Admission) error
	// Record judges one attempt with the installed policy and applies it.
	Record(ctx context.Context, k Key, now int64, adm Admission, r Result) (Recorded, error)
	// Stalled counts a running attempt as a slow call the moment its
	// stream stalls (R-T5); its outcome is later recorded with Counted.
	Stalled(ctx context.Context, k Key, now int64) error
	ForceOpen(ctx context.Context, k Key, now int64, d time.Duration) error
	ForceClose(ctx context.Context, k Key, now int64) error
	Reset(ctx context.Context, k Key, now int64) error
	// Status reports a breaker for the admin API (R-API1, R-API3).
	Status(ctx context.Context, k Key, now int64) (Status, error)
	// Sweep makes due transitions on every breaker (R-S2).
	Sweep(ctx context.Context, now int64) error
	// SwapNote is a compare-and-set on a short-lived note every replica
	// reaches (notes.go): the attempts of one request meet through it.
	SwapNote(ctx context.Context, name string, prev, next []byte, ttl time.Duration) (cur []byte, ok bool, err error)
}

// InProcessStore is a Store whose calls never leave the process (Memory):
// they cannot stall, so a caller may make them where a remote store's
// call would be sent off the reply path. A wrapper that embeds the Store
// interface is not one.
type InProcessStore interface {
	Store
	InProcess() bool
}

// IsInProcess reports whether st's calls never leave the process.
func IsInProcess(st Store) bool {
	p, ok := st.(InProcessStore)
	return ok && p.InProcess()
}

// Spec is one breaker a configuration wants, with its resolved policy.
type Spec struct {
	ID     ID
	Policy *Policy
}

// Key names a breaker in Store calls. It is its ID plus, when the store
// handed it out at Install, a reference the store resolves without hashing
// strings on the decision path. A Key made by KeyOf is looked up by ID.
// Keys are small values; copy them freely.
type Key struct{ ref *keyRef }

type keyRef struct {
	id   ID
	slot uint32 // 0 = resolve by ID
}

// KeyOf returns the key of id without a resolved reference (admin calls,
// tests).
func KeyOf(id ID) Key { return Key{ref: &keyRef{id: id}} }

// NewKey returns a key that a store resolves through slot first; only
// Store implementations call it.
func NewKey(id ID, slot uint32) Key { return Key{ref: &keyRef{id: id, slot: slot}} }

// ID returns the breaker the key names.
func (k Key) ID() ID {
	if k.ref == nil {
		return ID{}
	}
	return k.ref.id
}

// Slot returns the store-assigned slot, 0 when none.
func (k Key) Slot() uint32 {
	if k.ref == nil {
		return 0
	}
	return k.ref.slot
}

// Same reports whether two keys are the very same reference (a store's fast
// path: a key it handed out, for the breaker it handed it out for).
func (k Key) Same(o Key) bool { return k.ref != nil && k.ref == o.ref }

// ErrUnknown is returned for a breaker that is not installed (a stream
// still on a config that a reload replaced, or a typo in an admin call).
var ErrUnknown = errors.New("breaker: not installed")

// RunSweeper sweeps st every interval (≤ 1 s keeps R-S2) until ctx ends.
// A sweep error (a shared store that is down) is reported to onErr and the
// sweep goes on. A clock with an Exact method (CoarseClock) is read through
// it, so that the sweep never keeps an idle clock ticking (R-L9).
func RunSweeper(ctx context.Context, st Store, clock Clock, interval time.Duration, onErr func(error)) {
	now := clock.Now
	if e, ok := clock.(interface{ Exact() time.Time }); ok {
		now = e.Exact
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := st.Sweep(ctx, now().UnixNano()); err != nil && onErr != nil {
				onErr(err)
			}
		}
	}
}
