package routes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"
)

// ErrNotFound: no such gateway (or no overlay to revert).
var ErrNotFound = errors.New("not found")

// Manager owns the effective config: the file (or the embedded default)
// overlaid by admin changes, kept per gateway (R-API2a). Every change is
// serialised, validated as a whole config before anything changes, stored,
// and put in force at once (the next decision uses it).
type Manager struct {
	Holder *Holder
	Store  OverlayStore
	Log    *slog.Logger
	// Report is told of every Runtime an admin change puts in force
	// (warnings, R-P2 fallbacks); the file reloader reports its own. It is
	// called after the manager's lock is released (R-L11): the reloader
	// holds its own lock while it calls ApplyFile, so reporting under ours
	// would take the two in the reverse order.
	Report func(*Runtime)
	// SharedStore: the overlays live in a shared store (Redis) that may be
	// unreachable when fusebox starts. Then fusebox starts on the file
	// alone (logged) and Refresh loads them when the store returns, rather
	// than not starting at all (R-ST4).
	SharedStore bool

	mu   sync.Mutex
	file []byte
	ovs  map[string]Overlay
}

// Open loads the stored overlays and composes them with the file document.
// An overlay that no longer fits the file is left out of the effective
// config (and logged), never a reason not to start.
func (m *Manager) Open(ctx context.Context, file []byte) (*Runtime, error) {
	ovs, _, err := m.loadOverlays(ctx)
	if errors.Is(err, ErrStoreEmpty) {
		ovs, err = map[string]Overlay{}, nil
	}
	if err != nil && m.SharedStore {
		m.log().Error("[config] the admin changes in the shared store could not be read: starting on the file alone until the store answers",
			"error", err.Error())
		ovs, err = map[string]Overlay{}, nil
	}
	if err != nil {
		return nil, err
	}
	rt, bad, err := compose(file, ovs, "")
	if err != nil {
		return nil, err
	}
	m.logBad(bad)
	m.file, m.ovs = file, ovs
	return rt, nil
}

// loadOverlays reads the stored overlays; entries that do not decode (or
// whose signature is bad) are logged, left out and named in bad.
func (m *Manager) loadOverlays(ctx context.Context) (ovs map[string]Overlay, bad []string, err error) {
	ovs, err = m.Store.Load(ctx)
	var be *BadOverlaysError
	if errors.As(err, &be) {
		m.log().Error("[config] "+be.Error(), "gateways", be.IDs)
		return ovs, be.IDs, nil
	}
	return ovs, nil, err
}

// Refresh reloads the stored overlays and puts the result in force: another
// replica changed one in the shared store (R-API2a). On error (the store is
// unreachable) nothing changes.
func (m *Manager) Refresh(ctx context.Context) error {
	m.mu.Lock()
	rt, err := m.refresh(ctx)
	m.mu.Unlock()
	m.report(rt)
	return err
}

func (m *Manager) refresh(ctx context.Context) (*Runtime, error) {
	ovs, unreadable, err := m.loadOverlays(ctx)
	if errors.Is(err, ErrStoreEmpty) {
		if len(m.ovs) == 0 {
			return nil, nil
		}
		// The shared store lost every admin change (restarted empty,
		// flushed, failed over to a replica without them): what is in
		// force here goes back (R-ST9). Before, a replica started after a
		// FLUSHALL ran without them, and the others followed at their next
		// reload.
		for id, o := range m.ovs {
			if err := m.Store.Save(ctx, id, &o); err != nil {
				return nil, fmt.Errorf("writing the admin changes back to the emptied store: %w", err)
			}
		}
		m.log().Warn("[config] the shared store had lost the admin changes: this replica's were written back", "gateways", len(m.ovs))
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// A stored entry that cannot be read (a bad signature, a value that is
	// not an overlay) changes nothing: the overlay in force stays (R-L12).
	for _, id := range unreadable {
		if o, ok := m.ovs[id]; ok {
			ovs[id] = o
		}
	}
	changed := changedOverlays(m.ovs, ovs)
	if len(changed) == 0 {
		return nil, nil
	}
	rt, bad, err := compose(m.file, ovs, "")
	if err != nil {
		return nil, err
	}
	m.logBad(bad)
	m.put(keepStartSettings(rt, m.Holder.Load()), ovs)
	// The replica that made the change wrote its [admin] line; this one
	// says what it took from the shared store.
	m.log().Info("[config] admin changes from the shared store put in force", "gateways", strings.Join(changed, ","))
	return rt, nil
}

// changedOverlays names the gateways whose overlay differs between a and b.
func changedOverlays(a, b map[string]Overlay) []string {
	var out []string
	for id, o := range b {
		if p, ok := a[id]; !ok || p.Tombstone != o.Tombstone || string(p.Doc) != string(o.Doc) {
			out = append(out, id)
		}
	}
	for id := range a {
		if _, ok := b[id]; !ok {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// keepStartSettings gives rt the start-only settings in force in cur (an
// overlay change is not a restart).
func keepStartSettings(rt, cur *Runtime) *Runtime {
	rt.Listen, rt.Limits, rt.Admin, rt.Store, rt.Envoy = cur.Listen, cur.Limits, cur.Admin, cur.Store, cur.Envoy
	return rt
}

// put puts rt in force with the overlays it was composed from. The caller
// reports rt once the manager's lock is released.
func (m *Manager) put(rt *Runtime, ovs map[string]Overlay) {
	m.Holder.Store(rt)
	m.ovs = ovs
}

// report tells Report of a Runtime put in force (nil: none was). Never
// called with m.mu held (R-L11).
func (m *Manager) report(rt *Runtime) {
	if rt != nil && m.Report != nil {
		m.Report(rt)
	}
}

func (m *Manager) log() *slog.Logger {
	if m.Log != nil {
		return m.Log
	}
	return slog.Default()
}

func (m *Manager) logBad(bad map[string]error) {
	for id, err := range bad {
		m.log().Error("[config] a stored admin change to a gateway does not fit the config and is left out; fix or delete it through the admin API",
			"gateway", id, "error", err.Error())
	}
}

// ApplyFile composes a new file document with the overlays and puts it in
// force; prepare runs first (to keep start-only settings). On error nothing
// changes.
func (m *Manager) ApplyFile(data []byte, prepare func(*Runtime)) (*Runtime, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rt, bad, err := compose(data, m.ovs, "")
	if err != nil {
		return nil, err
	}
	m.logBad(bad)
	if prepare != nil {
		prepare(rt)
	}
	m.Holder.Store(rt)
	m.file = data
	return rt, nil
}

// Put creates or replaces gateway id with doc (a JSON object with the config
// file's field names; "source" is ignored, "id" must be id when given).
// The body is bounded and decoded before the lock is taken (R-L13): a
// hostile body costs its sender, not every other change.
func (m *Manager) Put(ctx context.Context, id string, doc []byte) (*Gateway, error) {
	obj, err := jsonObject(doc)
	if err != nil {
		return nil, err
	}
	return m.locked(ctx, func() (*Runtime, *Gateway, error) {
		if err := m.stale(ctx, id); err != nil {
			return nil, nil, err
		}
		return m.change(ctx, id, obj)
	})
}

// Patch applies a merge patch to gateway id's document: objects merge,
// null removes a field (so the inherited value applies), arrays replace —
// except models and routes, which merge entry by entry (R-API2b,
// entries.go); id cannot change.
func (m *Manager) Patch(ctx context.Context, id string, patch []byte) (*Gateway, error) {
	p, err := jsonObject(patch)
	if err != nil {
		return nil, err
	}
	if err := checkNamedPatch(p); err != nil {
		return nil, err
	}
	return m.locked(ctx, func() (*Runtime, *Gateway, error) {
		base, err := m.current(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		return m.change(ctx, id, mergeGateway(base, p))
	})
}

// locked runs one change under the manager's lock, then reports the
// Runtime it put in force once the lock is released (R-L11). A change the
// shared store refused because another replica changed the overlay since
// this one read it (ErrConflict) is re-applied on the fresh overlays: an
// acknowledged change is never lost, nor does it erase another's (R-ST9).
func (m *Manager) locked(ctx context.Context, fn func() (*Runtime, *Gateway, error)) (*Gateway, error) {
	m.mu.Lock()
	var reports []*Runtime
	rt, g, err := fn()
	for try := 0; errors.Is(err, ErrConflict) && try < 5; try++ {
		fresh, rerr := m.refresh(ctx)
		if rerr != nil {
			err = rerr
			break
		}
		reports = append(reports, fresh)
		rt, g, err = fn()
	}
	m.mu.Unlock()
	for _, r := range append(reports, rt) {
		m.report(r)
	}
	return g, err
}

// change validates and applies a new document for gateway id.
func (m *Manager) change(ctx context.Context, id string, obj map[string]any) (*Runtime, *Gateway, error) {
	delete(obj, "source")
	delete(obj, "effective") // read-only views of GET
	delete(obj, "revision")
	if v, ok := obj["id"]; ok && v != id {
		return nil, nil, &ConfigError{Problems: []string{fmt.Sprintf("id: the id of a gateway cannot change (it is %q)", id)}}
	}
	obj["id"] = id
	doc, err := json.Marshal(obj)
	if err != nil {
		return nil, nil, err
	}
	return m.commit(ctx, id, &Overlay{Doc: doc, UpdatedAt: time.Now().UTC()})
}

// Delete removes gateway id: a file gateway gets a tombstone, an admin one
// loses its overlay.
func (m *Manager) Delete(ctx context.Context, id string) error {
	_, err := m.locked(ctx, func() (*Runtime, *Gateway, error) {
		if _, ok := m.Holder.Load().Gateways[id]; !ok {
			return nil, nil, ErrNotFound
		}
		if err := m.stale(ctx, id); err != nil {
			return nil, nil, err
		}
		var o *Overlay
		if m.inFile(id) {
			o = &Overlay{Tombstone: true, UpdatedAt: time.Now().UTC()}
		}
		return m.commit(ctx, id, o)
	})
	return err
}

// RevertOverlay removes gateway id's overlay: the file's gateway (if any)
// is in force again. It returns that gateway, or nil when the file has none.
func (m *Manager) RevertOverlay(ctx context.Context, id string) (*Gateway, error) {
	return m.locked(ctx, func() (*Runtime, *Gateway, error) {
		if _, ok := m.ovs[id]; !ok {
			return nil, nil, ErrNotFound
		}
		return m.commit(ctx, id, nil)
	})
}

func (m *Manager) inFile(id string) bool {
	f, err := decodeFile(m.file, Options{})
	if err != nil {
		return false
	}
	for _, g := range f.Gateways {
		if g.ID == id {
			return true
		}
	}
	return false
}

// commit composes the config with overlay o for id (nil: none), and only
// when it compiles stores it and puts it in force. It returns the Runtime
// put in force, for the caller to report once unlocked.
func (m *Manager) commit(ctx context.Context, id string, o *Overlay) (*Runtime, *Gateway, error) {
	next := make(map[string]Overlay, len(m.ovs)+1)
	for k, v := range m.ovs {
		next[k] = v
	}
	if o == nil {
		delete(next, id)
	} else {
		next[id] = *o
	}
	rt, bad, err := compose(m.file, next, id)
	if err != nil {
		return nil, nil, err
	}
	if err := bad[id]; err != nil {
		return nil, nil, err
	}
	keepStartSettings(rt, m.Holder.Load())
	if err := m.Store.Save(ctx, id, o); err != nil {
		return nil, nil, fmt.Errorf("storing the change: %w", err)
	}
	m.put(rt, next)
	return rt, rt.Gateways[id], nil
}

// compose decodes the file, applies the overlays and compiles the result.
// Overlays that do not fit are left out and returned in bad (strict names
// the one an admin request changes: it is decoded strictly). The error is
// the file's own, or the strict overlay's.
func compose(file []byte, ovs map[string]Overlay, strict string) (*Runtime, map[string]error, error) {
	build := func(use map[string]Overlay) (*Runtime, map[string]error, error) {
		f, err := decodeFile(file, Options{})
		if err != nil {
			return nil, nil, err
		}
		bad := overlaid(f, file, use, strict)
		rt, err := compileHashed(f, file, Options{})
		return rt, bad, err
	}
	rt, bad, err := build(ovs)
	if err == nil {
		return rt, bad, nil
	}
	// Find the overlays that break the config, one at a time.
	ids := make([]string, 0, len(ovs))
	for id := range ovs {
		if _, known := bad[id]; !known {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	if len(ids) == 0 {
		return nil, nil, err
	}
	if _, _, ferr := build(nil); ferr != nil {
		return nil, nil, ferr // the file itself does not compile
	}
	keep := map[string]Overlay{}
	for _, id := range ids {
		if _, _, e := build(map[string]Overlay{id: ovs[id]}); e != nil {
			bad[id] = e
			continue
		}
		keep[id] = ovs[id]
	}
	if e, ok := bad[strict]; ok && strict != "" {
		return nil, nil, e
	}
	rt, more, err := build(keep)
	if err != nil {
		return nil, nil, err
	}
	for id, e := range more {
		bad[id] = e
	}
	return rt, bad, nil
}

// jsonObject decodes a request body that must be one JSON object, once it
// is within the R-L13 bounds.
func jsonObject(b []byte) (map[string]any, error) {
	if err := CheckJSONBounds(b); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &ConfigError{Problems: []string{"body: not JSON: " + err.Error()}}
	}
	if dec.More() {
		return nil, &ConfigError{Problems: []string{"body: trailing data after the JSON object"}}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, &ConfigError{Problems: []string{"body: must be a JSON object"}}
	}
	return obj, nil
}

// mergePatch applies an RFC 7396 JSON merge patch.
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	} else {
		c := make(map[string]any, len(t))
		for k, v := range t {
			c[k] = v
		}
		t = c
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}
