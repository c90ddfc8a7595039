package routes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Changes to one named entry of a gateway, and revisions (SPEC R-API2b).
//
// A gateway PATCH merges the arrays of named objects by name (`models` by
// `name`, `routes` by `key`): an entry the patch does not name is kept, one
// it names is merge-patched into the existing one (or added). RFC 7396
// alone would replace the whole array, and a PATCH naming one model would
// silently drop the others. The sub-resources change one entry.
//
// Every gateway document has a revision, a digest of its content: a change
// sent with If-Match is made only while the document is still that
// revision (checked under the manager's lock, and again when a shared
// store's compare-and-set makes the change re-apply on a fresher document),
// so two editors never overwrite each other unknowingly.

// ErrStale is a change whose If-Match names a revision the document no
// longer has.
var ErrStale = errors.New("the gateway changed since that revision (If-Match)")

// ErrNoEntry is a sub-resource change naming an entry the gateway lacks.
var ErrNoEntry = errors.New("no such entry")

// namedArrays are the document's arrays of named objects, by the field
// that names an entry.
var namedArrays = map[string]string{"models": "name", "routes": "key"}

// Revision names a gateway document's content (16 hex digits of SHA-256).
func Revision(doc []byte) string {
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:8])
}

type ifMatchKey struct{}

// WithIfMatch makes the changes made with ctx conditional on the gateway's
// revision being rev (an HTTP If-Match value; quotes are ignored).
func WithIfMatch(ctx context.Context, rev string) context.Context {
	return context.WithValue(ctx, ifMatchKey{}, strings.Trim(strings.TrimSpace(rev), `"`))
}

// stale reports ErrStale when ctx carries an If-Match that gateway id's
// document in force no longer matches (or that names a gateway that does
// not exist). The caller holds m.mu.
func (m *Manager) stale(ctx context.Context, id string) error {
	want, _ := ctx.Value(ifMatchKey{}).(string)
	if want == "" || want == "*" && m.Holder.Load().Gateways[id] != nil {
		return nil
	}
	g, ok := m.Holder.Load().Gateways[id]
	if !ok || Revision(g.Doc) != want {
		return ErrStale
	}
	return nil
}

// mergeGateway applies a gateway PATCH: RFC 7396 for every field, except
// that the named arrays merge entry by entry.
func mergeGateway(base, patch map[string]any) map[string]any {
	plain := make(map[string]any, len(patch))
	for k, v := range patch {
		if _, named := namedArrays[k]; !named {
			plain[k] = v
		}
	}
	out, _ := mergePatch(base, plain).(map[string]any)
	for field, key := range namedArrays {
		pv, ok := patch[field]
		if !ok {
			continue
		}
		list, isList := pv.([]any)
		if !isList {
			// null removes the field, anything else replaces it (and the
			// validator says what is wrong with it).
			if pv == nil {
				delete(out, field)
			} else {
				out[field] = pv
			}
			continue
		}
		out[field] = mergeNamed(out[field], list, key)
	}
	return out
}

// checkNamedPatch refuses what a PATCH's named arrays cannot mean: a null
// entry (it was stored as is, and stayed after a restart) and one name
// given twice (the last silently won). Each is a 400 naming the entry.
func checkNamedPatch(patch map[string]any) error {
	var problems []string
	for field, key := range namedArrays {
		list, ok := patch[field].([]any)
		if !ok {
			continue
		}
		seen := map[string]int{}
		for i, e := range list {
			obj, ok := e.(map[string]any)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s[%d]: must be an object (to remove an entry, DELETE it: /admin/v1/gateways/{id}/%s/{%s})", field, i, field, key))
				continue
			}
			name, _ := obj[key].(string)
			if j, dup := seen[name]; dup && name != "" {
				problems = append(problems, fmt.Sprintf("%s[%d]: %s %q: given twice in one PATCH (also %s[%d])", field, i, key, name, field, j))
			}
			seen[name] = i
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return &ConfigError{Problems: problems}
	}
	return nil
}

// mergeNamed merges patch entries into base by their key field; an entry
// without a usable name is appended as it is, for the validator to refuse.
func mergeNamed(base any, patch []any, key string) []any {
	cur, _ := base.([]any)
	out := append([]any(nil), cur...)
	index := map[string]int{}
	for i, e := range out {
		if obj, ok := e.(map[string]any); ok {
			if n, ok := obj[key].(string); ok {
				index[n] = i
			}
		}
	}
	for _, e := range patch {
		obj, ok := e.(map[string]any)
		name, named := obj[key].(string)
		if !ok || !named || name == "" {
			out = append(out, e)
			continue
		}
		if i, ok := index[name]; ok {
			out[i] = mergePatch(out[i], obj)
			continue
		}
		index[name] = len(out)
		out = append(out, obj)
	}
	return out
}

// EntryOp is what a sub-resource change does to one entry.
type EntryOp int

// Entry operations.
const (
	EntryPut    EntryOp = iota // create or replace
	EntryPatch                 // merge-patch an existing entry
	EntryDelete                // remove an existing entry
)

// Entry returns the entry of gateway id's document in field ("models" or
// "routes") named name.
func (m *Manager) Entry(id, field, name string) (map[string]any, error) {
	doc, err := m.current(context.Background(), id)
	if err != nil {
		return nil, err
	}
	_, e := findEntry(doc, field, name)
	if e == nil {
		return nil, ErrNoEntry
	}
	return e, nil
}

func findEntry(doc map[string]any, field, name string) (int, map[string]any) {
	list, _ := doc[field].([]any)
	for i, e := range list {
		if obj, ok := e.(map[string]any); ok && obj[namedArrays[field]] == name {
			return i, obj
		}
	}
	return -1, nil
}

// ChangeEntry changes one entry of gateway id's document: field is
// "models" or "routes", name the entry's name or key, body the entry (put)
// or a merge patch (patch). The whole document is validated as any change
// is: removing a route a model still names, or a model's last route, is
// refused naming both.
func (m *Manager) ChangeEntry(ctx context.Context, id, field, name string, op EntryOp, body []byte) (*Gateway, error) {
	key, ok := namedArrays[field]
	if !ok {
		return nil, fmt.Errorf("routes: %q has no named entries", field)
	}
	var obj map[string]any
	if op != EntryDelete {
		var err error
		if obj, err = jsonObject(body); err != nil {
			return nil, err
		}
		if v, ok := obj[key]; ok && v != name {
			return nil, &ConfigError{Problems: []string{fmt.Sprintf("%s: the %s of an entry cannot change (it is %q)", key, key, name)}}
		}
		obj[key] = name
	}
	return m.locked(ctx, func() (*Runtime, *Gateway, error) {
		doc, err := m.current(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		list, _ := doc[field].([]any)
		list = append([]any(nil), list...)
		i, cur := findEntry(doc, field, name)
		switch {
		case op == EntryPut && cur == nil:
			list = append(list, obj)
		case cur == nil:
			return nil, nil, ErrNoEntry
		case op == EntryPut:
			list[i] = obj
		case op == EntryPatch:
			list[i] = mergePatch(cur, obj)
		default:
			list = append(list[:i], list[i+1:]...)
		}
		doc[field] = list
		return m.change(ctx, id, doc)
	})
}

// current is gateway id's document in force, for a change made under the
// manager's lock: ErrStale when ctx's If-Match no longer holds,
// ErrNotFound for an unknown gateway.
func (m *Manager) current(ctx context.Context, id string) (map[string]any, error) {
	if err := m.stale(ctx, id); err != nil {
		return nil, err
	}
	g, ok := m.Holder.Load().Gateways[id]
	if !ok {
		return nil, ErrNotFound
	}
	var doc map[string]any
	if err := json.Unmarshal(g.Doc, &doc); err != nil {
		return nil, err
	}
	return doc, nil
}
