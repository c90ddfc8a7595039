package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Overlays keeps the admin config overlays in Redis (R-API2a): one hash,
// a field per gateway holding its overlay document as the config manager
// encodes it. A change is announced on the feed, so every replica reloads
// the overlays and puts them in force at once.
//
// Each field carries a revision, "fbxr:<revision>:<document>", and a change
// is a compare-and-set against the revision the replica last read (R-ST9):
// two replicas changing one gateway at once cannot both win silently; the
// loser reads again and re-applies its change. A removed overlay keeps its
// field with an empty document, so its revision survives, and a hash with
// no field at all means Redis lost them (breaker.ErrOverlaysEmpty).
type Overlays struct {
	Store *Store
}

func (o *Overlays) hash() string { return o.Store.prefix + "overlays" }

const revMagic = "fbxr:"

// splitRev reads a field's revision and document; a value an earlier
// fusebox wrote has revision 0.
func splitRev(v string) (int64, string) {
	if !strings.HasPrefix(v, revMagic) {
		return 0, v
	}
	rest := v[len(revMagic):]
	i := strings.IndexByte(rest, ':')
	if i < 0 {
		return 0, v
	}
	n, err := strconv.ParseInt(rest[:i], 10, 64)
	if err != nil {
		return 0, v
	}
	return n, rest[i+1:]
}

// Load returns every stored overlay document by gateway id, with every
// field's revision (removed ones included).
func (o *Overlays) Load(ctx context.Context) (map[string][]byte, error) {
	docs, _, err := o.LoadRevisions(ctx)
	return docs, err
}

// LoadRevisions implements breaker.RevisionedBackend.
func (o *Overlays) LoadRevisions(ctx context.Context) (map[string][]byte, map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*o.Store.timeout)
	defer cancel()
	m, err := o.Store.rdb.HGetAll(ctx, o.hash()).Result()
	if err != nil {
		err = fmt.Errorf("redis overlays: %w", err)
		if keyError(err) {
			// The hash itself is bad (another type under its key): that is
			// the overlays' problem, not Redis being unreachable.
			o.Store.count("overlay_load")
			return nil, nil, err
		}
		// Counted, not degrading: a slow read of a large hash says nothing
		// of the breakers' calls, and when Redis is really away those
		// calls degrade the store on their own (the resync on its return
		// loads the overlays again). Before, one overlay load timeout
		// turned the whole store degraded.
		o.Store.count("overlay_load")
		return nil, nil, err
	}
	if len(m) == 0 {
		return map[string][]byte{}, map[string]int64{}, breaker.ErrOverlaysEmpty
	}
	out := make(map[string][]byte, len(m))
	revs := make(map[string]int64, len(m))
	var bad []string
	for id, v := range m {
		if id == breaker.OverlayEpochField {
			revs[id], _ = strconv.ParseInt(v, 10, 64)
			continue
		}
		rev, raw := splitRev(v)
		revs[id] = rev
		if raw == "" {
			continue // removed; its revision stays
		}
		doc, err := o.Store.sign.openOverlay(o.hash(), id, []byte(raw))
		if err != nil {
			bad = append(bad, id)
			o.Store.refused("overlay_unsigned", "[config] an admin change in Redis without a valid signature was ignored (store.redis.hmac_key_file is set): something other than a fusebox replica of this fleet wrote it")
			continue
		}
		out[id] = doc
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return out, revs, &breaker.BadOverlaysError{IDs: bad}
	}
	return out, revs, nil
}

// saveIf is the compare-and-set: the field is written only when its
// revision is still the one expected (any, for -1), and its revision grows
// by one.
// The first write into an empty hash names its lineage (epoch, a fresh
// random number; breaker.OverlayEpochField).
//
// The overlay scripts take named arguments (R-ST16, overlayArgs): field
// (the gateway), rev (expected, or the one to restore), value, epoch.
var saveIf = redis.NewScript(`
local A = cmsgpack.unpack(ARGV[1])
local cur = redis.call('HGET', KEYS[1], A.field)
local rev = 0
if cur then rev = tonumber(string.match(cur, '^fbxr:(%d+):')) or 0 end
if A.rev >= 0 and rev ~= A.rev then return {0, rev} end
rev = rev + 1
redis.call('HSETNX', KEYS[1], '~epoch', A.epoch)
redis.call('HSET', KEYS[1], A.field, 'fbxr:' .. rev .. ':' .. A.value)
return {1, rev, redis.call('HGET', KEYS[1], '~epoch')}
`)

// Save stores gateway id's overlay document (nil removes it) whatever its
// revision, and tells the other replicas.
func (o *Overlays) Save(ctx context.Context, id string, doc []byte) error {
	_, _, err := o.save(ctx, id, doc, -1)
	return err
}

// SaveIf implements breaker.RevisionedBackend: it stores id's document only
// when the stored revision is expect (breaker.ErrOverlayConflict otherwise) and
// returns the new revision.
func (o *Overlays) SaveIf(ctx context.Context, id string, doc []byte, expect int64) (int64, int64, error) {
	return o.save(ctx, id, doc, expect)
}

func (o *Overlays) save(ctx context.Context, id string, doc []byte, expect int64) (int64, int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 4*o.Store.timeout)
	defer cancel()
	val := ""
	if doc != nil {
		val = string(o.Store.sign.sealOverlay(o.hash(), id, doc))
	}
	rev, epoch, err := o.cas(cctx, id, expect, val)
	if err != nil {
		return 0, 0, err
	}
	if err := o.Store.PublishOverlay(ctx, id); err != nil {
		// Stored: the others pick it up at their next overlay check.
		o.Store.count("publish")
	}
	return rev, epoch, nil
}

func (o *Overlays) cas(ctx context.Context, id string, expect int64, val string) (int64, int64, error) {
	// The epoch comes back as the stored string: as a Lua number (a
	// double) a 63-bit epoch was rounded, and differed from what a load
	// reads (TestSaveEpochIsTheStoredOne).
	res, err := saveIf.Run(ctx, o.Store.rdb, []string{o.hash()}, overlayArgs(id, expect, val)).Slice()
	if err != nil {
		o.Store.count("overlay_save")
		return 0, 0, fmt.Errorf("redis overlays: %w", err)
	}
	if len(res) < 2 {
		return 0, 0, fmt.Errorf("redis overlays: a reply of %d values", len(res))
	}
	ok, _ := res[0].(int64)
	rev, _ := res[1].(int64)
	switch {
	case len(res) == 2 && ok == 0:
		return rev, 0, breaker.ErrOverlayConflict
	case len(res) == 3 && ok == 1:
		epoch, err := strconv.ParseInt(asString(res[2]), 10, 64)
		if err == nil {
			return rev, epoch, nil
		}
	}
	return 0, 0, fmt.Errorf("redis overlays: a reply of %d values", len(res))
}

// restoreAt writes the field at revision rev only when its stored
// revision is lower (breaker.RevisionedBackend.Restore).
var restoreAt = redis.NewScript(`
local A = cmsgpack.unpack(ARGV[1])
local cur = redis.call('HGET', KEYS[1], A.field)
local rev = 0
if cur then rev = tonumber(string.match(cur, '^fbxr:(%d+):')) or 0 end
if rev >= A.rev then return 0 end
redis.call('HSET', KEYS[1], A.field, 'fbxr:' .. A.rev .. ':' .. A.value)
return 1
`)

// restoreIfAbsent writes the field at revision rev only when the hash has
// no such field (breaker.RevisionedBackend.RestoreIfAbsent); into an empty
// hash it names a lineage, as a first write does.
var restoreIfAbsent = redis.NewScript(`
local A = cmsgpack.unpack(ARGV[1])
if redis.call('HEXISTS', KEYS[1], A.field) == 1 then return 0 end
redis.call('HSETNX', KEYS[1], '~epoch', A.epoch)
redis.call('HSET', KEYS[1], A.field, 'fbxr:' .. A.rev .. ':' .. A.value)
return 1
`)

// overlayArgs are the overlay scripts' named arguments.
func overlayArgs(id string, rev int64, val string) string {
	// The epoch goes as a string: a Lua number (a double) would round it.
	return string(msgpackMap(args{{"field", id}, {"rev", rev}, {"value", val}, {"epoch", strconv.FormatInt(newEpoch(), 10)}}))
}

// newEpoch is a fresh lineage number for an empty hash.
func newEpoch() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:])>>1) | 1
}

// AskRestore tells the other replicas, if any are listening, that this one
// found Redis holding no admin changes: each reads the overlays now and
// puts back what it knew (R-ST15), rather than at its next periodic read.
// It reports whether another replica listens (false: nobody to wait for).
func (o *Overlays) AskRestore(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, o.Store.timeout)
	defer cancel()
	subs, err := o.Store.rdb.PubSubNumSub(cctx, o.Store.feed).Result()
	if err != nil || subs[o.Store.feed] == 0 {
		return false
	}
	if err := o.Store.PublishOverlay(ctx, ""); err != nil {
		o.Store.count("publish")
		return false
	}
	return true
}

// RestoreIfAbsent implements breaker.RevisionedBackend: Redis was emptied,
// and this replica puts back the change it knew where no replica has
// written one since.
func (o *Overlays) RestoreIfAbsent(ctx context.Context, id string, doc []byte, rev int64) (bool, error) {
	return o.restore(ctx, restoreIfAbsent, id, doc, rev)
}

// Restore implements breaker.RevisionedBackend: Redis went back to an
// older revision of id (a failover to a replica without the last writes),
// and this replica puts the one it knew back, then tells the others.
func (o *Overlays) Restore(ctx context.Context, id string, doc []byte, rev int64) (bool, error) {
	return o.restore(ctx, restoreAt, id, doc, rev)
}

func (o *Overlays) restore(ctx context.Context, sc *redis.Script, id string, doc []byte, rev int64) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 4*o.Store.timeout)
	defer cancel()
	val := ""
	if doc != nil {
		val = string(o.Store.sign.sealOverlay(o.hash(), id, doc))
	}
	n, err := sc.Run(cctx, o.Store.rdb, []string{o.hash()}, overlayArgs(id, rev, val)).Int64()
	if err != nil {
		o.Store.count("overlay_save")
		return false, fmt.Errorf("redis overlays: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	if err := o.Store.PublishOverlay(ctx, id); err != nil {
		o.Store.count("publish")
	}
	return true, nil
}
