package routes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// RawOverlayBackend keeps overlay documents as bytes by gateway id: a
// shared store (redisstore.Overlays) that knows nothing of the config.
type RawOverlayBackend interface {
	Load(ctx context.Context) (map[string][]byte, error)
	Save(ctx context.Context, id string, doc []byte) error
}

// SharedOverlays is the OverlayStore of a shared backend: every replica
// reads and writes the same overlays (R-API2a, Redis: "in Redis").
type SharedOverlays struct {
	Backend RawOverlayBackend
}

// Load implements OverlayStore. An entry that does not decode is skipped
// with an error naming it, never a reason to drop the others.
func (s *SharedOverlays) Load(ctx context.Context) (map[string]Overlay, error) {
	raw, err := s.Backend.Load(ctx)
	var bad []string
	var be *BadOverlaysError
	if errors.As(err, &be) {
		bad = append(bad, be.IDs...) // the backend refused these (a bad signature); the rest loaded
	} else if err != nil {
		return nil, err
	}
	out := make(map[string]Overlay, len(raw))
	for id, b := range raw {
		var o Overlay
		if err := json.Unmarshal(b, &o); err != nil {
			bad = append(bad, id)
			continue
		}
		out[id] = o
	}
	if len(bad) > 0 {
		return out, &BadOverlaysError{IDs: bad}
	}
	return out, nil
}

// Save implements OverlayStore.
func (s *SharedOverlays) Save(ctx context.Context, id string, o *Overlay) error {
	if o == nil {
		return s.Backend.Save(ctx, id, nil)
	}
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return s.Backend.Save(ctx, id, b)
}

// BadOverlaysError names stored overlays that are not overlay documents;
// the others loaded.
type BadOverlaysError struct{ IDs []string }

func (e *BadOverlaysError) Error() string {
	return fmt.Sprintf("stored overlays that do not decode were skipped: %v", e.IDs)
}
