package shared

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// Overlays is the OverlayStore of a shared backend: every replica
// reads and writes the same overlays (R-API2a, Redis: "in Redis"). With a
// routes.RevisionedBackend a change is written only onto the revision this
// replica last read.
type Overlays struct {
	Backend routes.RawOverlayBackend
	// OnRestored is told of each gateway whose admin change this replica
	// put back because the store had gone back to an older revision.
	OnRestored func(id string, rev int64)
	// Cache is the local overlay cache file (R-ST15, cache.go);
	// "" = none. OnCacheError is told when it cannot be read or written.
	Cache        string
	OnCacheError func(error)

	mu   sync.Mutex
	revs map[string]int64  // as last read or written
	docs map[string][]byte // the documents at those revisions (absent: removed)
	// unread: stored entries that did not decode (or whose signature was
	// bad) at the last read; what they held is unknown, so never restored.
	unread map[string]bool
	// cacheRead: the cache was read (once, before the first load);
	// fromCache: the revisions held came from it, not from a read of this
	// process (so they go back only into an emptied store).
	cacheRead, fromCache bool
}

// Load implements OverlayStore. An entry that does not decode is skipped
// with an error naming it, never a reason to drop the others.
func (s *Overlays) Load(ctx context.Context) (map[string]routes.Overlay, error) {
	if err := s.readCache(); err != nil {
		s.cacheError(err)
	}
	var raw map[string][]byte
	var revs map[string]int64
	var err error
	if rb, ok := s.Backend.(routes.RevisionedBackend); ok {
		raw, revs, err = rb.LoadRevisions(ctx)
	} else {
		raw, err = s.Backend.Load(ctx)
	}
	if errors.Is(err, routes.ErrStoreEmpty) && s.firstLoad() {
		raw, revs, err = s.askRestore(ctx, raw, revs, err)
	}
	var bad []string
	var be *routes.BadOverlaysError
	empty := errors.Is(err, routes.ErrStoreEmpty)
	switch {
	case errors.As(err, &be):
		bad = append(bad, be.IDs...) // the backend refused these (a bad signature); the rest loaded
	case empty:
	case err != nil:
		return nil, err
	}
	if rb, ok := s.Backend.(routes.RevisionedBackend); ok {
		if s.restoreWentBack(ctx, rb, raw, revs, bad, empty) {
			empty = false
		}
	}
	if revs != nil {
		docs := make(map[string][]byte, len(raw))
		for id, d := range raw {
			docs[id] = d
		}
		unread := map[string]bool{}
		for _, id := range bad {
			unread[id] = true
		}
		s.mu.Lock()
		s.revs, s.docs, s.unread, s.fromCache = revs, docs, unread, false
		s.mu.Unlock()
		if err := s.writeCache(); err != nil {
			s.cacheError(err)
		}
	}
	out := make(map[string]routes.Overlay, len(raw))
	for id, b := range raw {
		var o routes.Overlay
		if err := json.Unmarshal(b, &o); err != nil {
			bad = append(bad, id)
			continue
		}
		out[id] = o
	}
	if len(bad) > 0 {
		return out, &routes.BadOverlaysError{IDs: bad}
	}
	if empty {
		return out, routes.ErrStoreEmpty
	}
	return out, nil
}

// RestoreAsker is a backend that can ask the other replicas to put back
// the admin changes they knew into an emptied store (AskRestore reports
// whether any listens).
type RestoreAsker interface {
	AskRestore(ctx context.Context) bool
}

// askRestoreWait bounds how long a replica that starts on an emptied store
// waits for the others to put their admin changes back: a read, a script
// and a publish on each side, with room for a loaded machine. It is paid
// only when the store is empty and other replicas listen.
const askRestoreWait = 2 * time.Second

// firstLoad: no load has read the store yet.
func (s *Overlays) firstLoad() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.revs == nil
}

// askRestore: this replica starts on a store that holds no admin change,
// while other replicas run (#49). Redis was emptied (FLUSHALL, a restart
// without persistence) and what they knew goes back at their next read:
// they are asked to read now, and the store is read again until it holds
// something, within askRestoreWait. Before, a replica that started then ran
// on the file's settings until the others' periodic read: a fresh trip it
// judged at the file's threshold was lost.
func (s *Overlays) askRestore(ctx context.Context, raw map[string][]byte, revs map[string]int64, err error) (map[string][]byte, map[string]int64, error) {
	asker, ok := s.Backend.(RestoreAsker)
	rb, ok2 := s.Backend.(routes.RevisionedBackend)
	if !ok || !ok2 || !asker.AskRestore(ctx) {
		return raw, revs, err
	}
	deadline := time.Now().Add(askRestoreWait)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return raw, revs, err
		case <-time.After(25 * time.Millisecond):
		}
		r2, v2, e2 := rb.LoadRevisions(ctx)
		if !errors.Is(e2, routes.ErrStoreEmpty) {
			return r2, v2, e2
		}
	}
	return raw, revs, err
}

// Save implements OverlayStore: with revisions, a compare-and-set on the
// revision last read (routes.ErrConflict when another replica changed it since).
func (s *Overlays) Save(ctx context.Context, id string, o *routes.Overlay) error {
	var b []byte
	if o != nil {
		var err error
		if b, err = json.Marshal(o); err != nil {
			return err
		}
	}
	rb, ok := s.Backend.(routes.RevisionedBackend)
	if !ok {
		return s.Backend.Save(ctx, id, b)
	}
	s.mu.Lock()
	expect := s.revs[id]
	s.mu.Unlock()
	rev, epoch, err := rb.SaveIf(ctx, id, b, expect)
	if err != nil {
		// On a conflict the revision last read stays: only a new read
		// (Load) may move it, so a retry re-applies the change on top of
		// the other replica's.
		return err
	}
	s.mu.Lock()
	if s.revs == nil {
		s.revs, s.docs = map[string]int64{}, map[string][]byte{}
	}
	s.revs[id] = rev
	if epoch != 0 {
		s.revs[routes.EpochField] = epoch
	}
	if b == nil {
		delete(s.docs, id)
	} else {
		s.docs[id] = b
	}
	delete(s.unread, id)
	s.mu.Unlock()
	if err := s.writeCache(); err != nil {
		s.cacheError(err)
	}
	return nil
}

func (s *Overlays) cacheError(err error) {
	if s.OnCacheError != nil {
		s.OnCacheError(err)
	}
}

// restoreWentBack finds the gateways whose stored revision is lower than
// the one this replica last read or wrote: the store went back (R-ST8: a
// failover promoted a replica that lacked the last writes; Redis
// replication is asynchronous), and an acknowledged admin change would be
// lost, on every replica at its next read. Each is put back at the
// revision this replica knew, and raw and revs then say so. A gateway
// some replica changed since (a revision of the known one or more) is
// left as stored. Into an emptied store (empty), and from the cache file
// always, a gateway goes back only where the store still holds nothing
// for it: a change another replica made into the emptied store is newer
// than anything this one knew, whatever its revision (R-ST15). It reports
// whether it put any back.
func (s *Overlays) restoreWentBack(ctx context.Context, rb routes.RevisionedBackend, raw map[string][]byte, revs map[string]int64, bad []string, empty bool) bool {
	s.mu.Lock()
	held, docs, unread, fromCache := s.revs, s.docs, s.unread, s.fromCache
	s.mu.Unlock()
	if fromCache && !empty {
		return false // the cache goes back only into an emptied store
	}
	// Emptied and written since: what this replica knew is older than
	// the store's lineage, and goes back only where nothing was written.
	relined := held[routes.EpochField] != 0 && revs[routes.EpochField] != 0 && held[routes.EpochField] != revs[routes.EpochField]
	restored := false
	for id, rev := range held {
		if id == routes.EpochField || revs[id] >= rev || unread[id] || slices.Contains(bad, id) {
			continue
		}
		doc := docs[id]
		restore := rb.Restore
		if empty || fromCache || relined {
			restore = rb.RestoreIfAbsent
		}
		ok, err := restore(ctx, id, doc, rev)
		if err != nil || !ok {
			continue // a newer change won meanwhile, or the store failed: the next read
		}
		restored = true
		revs[id] = rev
		if doc == nil {
			delete(raw, id)
		} else {
			raw[id] = doc
		}
		if s.OnRestored != nil {
			s.OnRestored(id, rev)
		}
	}
	return restored
}
