package breaker

import (
	"context"
	"errors"
	"fmt"
)

// The shared store of admin changes (overlay documents, R-API2a) is
// reached through these interfaces, which the store side owns: a remote
// store (redisstore.Overlays) keeps documents as bytes by gateway id and
// knows nothing of the config; pkg/routes/shared decodes them (shared.Overlays).
// So the arrows point down: routes and redisstore both import breaker,
// neither imports the other.

// RawOverlayBackend keeps overlay documents as bytes by gateway id.
type RawOverlayBackend interface {
	Load(ctx context.Context) (map[string][]byte, error)
	Save(ctx context.Context, id string, doc []byte) error
}

// RevisionedBackend is a backend whose documents carry revisions, changed
// by compare-and-set (R-ST9).
type RevisionedBackend interface {
	RawOverlayBackend
	// LoadRevisions returns the documents and every gateway's revision
	// (removed ones too); ErrOverlaysEmpty when the store holds nothing at
	// all.
	LoadRevisions(ctx context.Context) (map[string][]byte, map[string]int64, error)
	// SaveIf stores id's document (nil removes it) only when its revision
	// is still expect; ErrOverlayConflict otherwise. It returns the new
	// revision and the store's lineage (OverlayEpochField).
	SaveIf(ctx context.Context, id string, doc []byte, expect int64) (rev, epoch int64, err error)
	// Restore puts id's document (nil: removed) back at revision rev when
	// the stored revision is lower: the store went back (a failover to a
	// replica that lacked the last writes). A change made since, at a
	// revision of rev or more, is never overwritten. It reports whether it
	// wrote.
	Restore(ctx context.Context, id string, doc []byte, rev int64) (bool, error)
	// RestoreIfAbsent puts id's document back at revision rev only when
	// the store holds nothing for id (it was emptied): a change another
	// replica made into the emptied store, at whatever revision, is never
	// overwritten (R-ST15). It reports whether it wrote.
	RestoreIfAbsent(ctx context.Context, id string, doc []byte, rev int64) (bool, error)
}

// OverlayEpochField is the revisions' entry (and the shared store's field)
// that names the store's lineage: set by the first write into an empty
// store, so a store that was emptied and written again has another one,
// while a store that went back (a failover to a replica without the last
// writes) keeps it. 0 or absent: unknown (a store an earlier fusebox
// wrote).
const OverlayEpochField = "~epoch"

var (
	// ErrOverlayConflict: another replica changed the overlay since this
	// one read it. The manager reads again and re-applies the change.
	ErrOverlayConflict = errors.New("the overlay changed in the shared store since it was read")
	// ErrOverlaysEmpty: the shared store holds no overlay and no revision
	// at all (Redis restarted empty, was flushed, or failed over to a
	// replica without them), as opposed to every overlay having been
	// removed.
	ErrOverlaysEmpty = errors.New("the shared store holds no admin changes at all")
)

// BadOverlaysError names stored overlays that are not overlay documents;
// the others loaded.
type BadOverlaysError struct{ IDs []string }

func (e *BadOverlaysError) Error() string {
	return fmt.Sprintf("stored overlays that do not decode were skipped: %v", e.IDs)
}
