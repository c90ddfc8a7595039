package shared

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// The local overlay cache (SPEC R-ST15): each replica keeps the last
// overlay set it knew from a shared store, with the revisions, in a file of
// its own. When the store and the whole fleet restart together (a Redis
// without persistence), no replica's memory holds the admin changes any
// more; the cache does, and is written back into the emptied store, each
// gateway only where the store holds nothing for it (a change some replica
// made since is never overwritten).

// overlayCache is the cache file's content.
type overlayCache struct {
	Revisions map[string]int64  `json:"revisions"`
	Documents map[string][]byte `json:"documents"` // absent: removed
}

// readCache seeds the revisions and documents from the cache file when
// this replica knows none yet. A missing file is an empty cache.
func (s *Overlays) readCache() error {
	if s.Cache == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.revs != nil || s.cacheRead {
		return nil
	}
	s.cacheRead = true
	b, err := os.ReadFile(s.Cache)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("overlay cache %s: %w", s.Cache, err)
	}
	var c overlayCache
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("overlay cache %s: %w", s.Cache, err)
	}
	if c.Revisions == nil {
		return nil
	}
	if c.Documents == nil {
		c.Documents = map[string][]byte{}
	}
	s.revs, s.docs, s.fromCache = c.Revisions, c.Documents, true
	return nil
}

// writeCache writes the revisions and documents this replica knows,
// atomically (a temporary file renamed over the old one), so that a crash
// mid-write leaves the previous cache whole.
func (s *Overlays) writeCache() error {
	if s.Cache == "" {
		return nil
	}
	s.mu.Lock()
	c := overlayCache{Revisions: s.revs, Documents: s.docs}
	b, err := json.Marshal(c)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.Cache)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("overlay cache: %w", err)
	}
	f, err := os.CreateTemp(dir, ".overlays-*.tmp")
	if err != nil {
		return fmt.Errorf("overlay cache: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, s.Cache)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("overlay cache: %w", werr)
	}
	return nil
}
