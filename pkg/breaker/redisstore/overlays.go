package redisstore

import (
	"context"
	"fmt"
	"sort"

	"github.com/fusebox-llm/fusebox/pkg/routes"
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
		if keyError(err) {
			// The hash itself is bad (another type under its key): that is
			// the overlays' problem, not Redis being unreachable.
			o.Store.count("overlay_load")
			return nil, err
		}
		// Degraded: the resync on Redis's return loads them again.
		o.Store.failed("overlay_load", err)
		return nil, err
	}
	out := make(map[string][]byte, len(m))
	var bad []string
	for id, v := range m {
		doc, err := o.Store.sign.openOverlay(o.hash(), id, []byte(v))
		if err != nil {
			bad = append(bad, id)
			o.Store.refused("overlay_unsigned", "[config] an admin change in Redis without a valid signature was ignored (store.redis.hmac_key_file is set): something other than a fusebox replica of this fleet wrote it")
			continue
		}
		out[id] = doc
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return out, &routes.BadOverlaysError{IDs: bad}
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
		err = o.Store.rdb.HSet(cctx, o.hash(), id, o.Store.sign.sealOverlay(o.hash(), id, doc)).Err()
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
