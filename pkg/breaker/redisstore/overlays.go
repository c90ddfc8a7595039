package redisstore

import (
	"context"
	"fmt"
)

// Overlays keeps the admin config overlays in Redis (R-API2a): one hash,
// a field per gateway holding its overlay document as the config manager
// encodes it. A change is announced on the feed, so every replica reloads
// the overlays and puts them in force at once.
type Overlays struct {
	Store *Store
}

func (o *Overlays) hash() string { return o.Store.prefix + "overlays" }

// Load returns every stored overlay document by gateway id.
func (o *Overlays) Load(ctx context.Context) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*o.Store.timeout)
	defer cancel()
	m, err := o.Store.rdb.HGetAll(ctx, o.hash()).Result()
	if err != nil {
		err = fmt.Errorf("redis overlays: %w", err)
		// Degraded: the resync on Redis's return loads them again.
		o.Store.failed("overlay_load", err)
		return nil, err
	}
	out := make(map[string][]byte, len(m))
	for id, doc := range m {
		out[id] = []byte(doc)
	}
	return out, nil
}

// Save stores gateway id's overlay document (nil removes it) and tells the
// other replicas.
func (o *Overlays) Save(ctx context.Context, id string, doc []byte) error {
	cctx, cancel := context.WithTimeout(ctx, 4*o.Store.timeout)
	defer cancel()
	var err error
	if doc == nil {
		err = o.Store.rdb.HDel(cctx, o.hash(), id).Err()
	} else {
		err = o.Store.rdb.HSet(cctx, o.hash(), id, doc).Err()
	}
	if err != nil {
		o.Store.count("overlay_save")
		return fmt.Errorf("redis overlays: %w", err)
	}
	if err := o.Store.PublishOverlay(ctx, id); err != nil {
		// Stored: the others pick it up at their next overlay refresh.
		o.Store.count("publish")
	}
	return nil
}
