package routes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// Where a gateway comes from (R-API2).
const (
	SourceFile  = "file"
	SourceAdmin = "admin"
)

// Overlay is an admin change to one gateway (R-API2a): its whole document,
// or a tombstone that hides a gateway the file defines.
type Overlay struct {
	Doc       json.RawMessage `json:"doc,omitempty"`
	Tombstone bool            `json:"tombstone,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// OverlayStore keeps overlays across restarts. The memory backend is a
// file (FileOverlays); a shared store keeps them where every replica sees
// them.
type OverlayStore interface {
	// Load returns every stored overlay by gateway id.
	Load(ctx context.Context) (map[string]Overlay, error)
	// Save stores the overlay of id, or removes it when o is nil.
	Save(ctx context.Context, id string, o *Overlay) error
}

// FileOverlays keeps overlays in one JSON file, replaced atomically on every
// change (write a temporary file, fsync, rename, fsync the directory), so a
// crash leaves the old or the new set, never a torn one. An empty Path keeps
// them in memory only.
type FileOverlays struct {
	Path string
	// Log hears of a file moved aside and of leftovers removed at Load;
	// nil = slog.Default().
	Log *slog.Logger
	// OnCorrupt counts a file that did not decode and was moved aside.
	OnCorrupt func()
	// Now names the moved-aside file (tests); nil = time.Now.
	Now func() time.Time

	mu  sync.Mutex
	set map[string]Overlay
}

type overlayFile struct {
	Version  int                `json:"version"`
	Gateways map[string]Overlay `json:"gateways"`
}

// Load implements OverlayStore. A missing file is an empty set. Temporary
// files an interrupted write left behind are removed. A file that does not
// decode is moved aside (PATH.corrupt-<time>), logged and counted, and the
// set is empty: fusebox starts on its config file rather than not at all,
// and the operator still has the bytes to recover from.
func (f *FileOverlays) Load(context.Context) (map[string]Overlay, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = map[string]Overlay{}
	if f.Path == "" {
		return map[string]Overlay{}, nil
	}
	f.removeLeftovers()
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Overlay{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store.memory.persist_path: %w", err)
	}
	var of overlayFile
	if err := json.Unmarshal(b, &of); err != nil {
		return f.moveAside(err)
	}
	out := make(map[string]Overlay, len(of.Gateways))
	for id, o := range of.Gateways {
		f.set[id] = o
		out[id] = o
	}
	return out, nil
}

func (f *FileOverlays) log() *slog.Logger {
	if f.Log != nil {
		return f.Log
	}
	return slog.Default()
}

// moveAside renames a file that is not an overlay file out of the way.
func (f *FileOverlays) moveAside(decodeErr error) (map[string]Overlay, error) {
	now := time.Now
	if f.Now != nil {
		now = f.Now
	}
	aside := f.Path + ".corrupt-" + now().UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(f.Path, aside); err != nil {
		return nil, fmt.Errorf("store.memory.persist_path %s: not an overlay file (%v), and it could not be moved aside: %w", f.Path, decodeErr, err)
	}
	if f.OnCorrupt != nil {
		f.OnCorrupt()
	}
	f.log().Error("[config] store.memory.persist_path is not an overlay file: moved aside, starting without admin changes; recover them from the moved file and apply them through the admin API",
		"path", f.Path, "moved_to", aside, "error", decodeErr.Error())
	return map[string]Overlay{}, nil
}

// removeLeftovers deletes the temporary files of writes a crash
// interrupted (writeAtomic's ".NAME.*" beside the file).
func (f *FileOverlays) removeLeftovers() {
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".*"))
	for _, p := range left {
		if os.Remove(p) == nil {
			f.log().Info("[config] removed a temporary file of an interrupted admin change write", "path", p)
		}
	}
}

// Save implements OverlayStore.
func (f *FileOverlays) Save(_ context.Context, id string, o *Overlay) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := make(map[string]Overlay, len(f.set)+1)
	for k, v := range f.set {
		next[k] = v
	}
	if o == nil {
		delete(next, id)
	} else {
		next[id] = *o
	}
	if f.Path != "" {
		b, err := json.MarshalIndent(overlayFile{Version: 1, Gateways: next}, "", "  ")
		if err != nil {
			return err
		}
		if err := writeAtomic(f.Path, b); err != nil {
			return fmt.Errorf("store.memory.persist_path: %w", err)
		}
	}
	f.set = next
	return nil
}

func writeAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// decodeGateway reads a gateway document (JSON, or YAML) strictly into a
// spec. lenient marks a stored document: a malformed status list falls back
// to the default (R-P2) instead of failing.
func decodeGateway(doc []byte, lenient bool) (*GatewaySpec, error) {
	var gs GatewaySpec
	src := doc
	var generic any
	fromJSON := json.Unmarshal(doc, &generic) == nil
	if fromJSON {
		// A JSON body is one line: re-spell it as block YAML so that every
		// error can be placed at its field path, then drop the lines,
		// which would mean nothing to the sender.
		if y, err := yaml.Marshal(generic); err == nil {
			src = y
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&gs); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			var root yaml.Node
			_ = yaml.Unmarshal(src, &root)
			var ps []string
			for _, e := range te.Errors {
				msg := withFieldPath(friendlyYAMLError(e), &root)
				if fromJSON {
					msg = reLine.ReplaceAllString(msg, "")
				}
				ps = append(ps, msg)
			}
			return nil, &ConfigError{Problems: ps}
		}
		return nil, &ConfigError{Problems: []string{friendlyYAMLError(err.Error())}}
	}
	// Decode problems of the circuit_breaker levels are reported by the
	// compiler, with their gateway, model and route.
	for _, s := range gs.specs() {
		s.lenient = lenient
	}
	gs.source, gs.doc = SourceAdmin, compactJSON(doc)
	return &gs, nil
}

// specs returns every circuit_breaker level of the gateway.
func (gs *GatewaySpec) specs() []*PolicySpec {
	var out []*PolicySpec
	add := func(s *PolicySpec) {
		if s != nil {
			out = append(out, s)
		}
	}
	add(gs.CircuitBreaker)
	for i := range gs.Models {
		add(gs.Models[i].CircuitBreaker)
	}
	for i := range gs.Routes {
		add(gs.Routes[i].CircuitBreaker)
	}
	return out
}

func compactJSON(doc []byte) []byte {
	var v any
	if json.Unmarshal(doc, &v) != nil {
		// YAML: convert through a generic value.
		if yaml.Unmarshal(doc, &v) != nil {
			return doc
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return doc
	}
	return b
}

// fileGatewayDocs returns each file gateway's document as JSON, by index.
func fileGatewayDocs(data []byte) [][]byte {
	var doc struct {
		Gateways []any `yaml:"gateways"`
	}
	if yaml.Unmarshal(data, &doc) != nil {
		return nil
	}
	out := make([][]byte, len(doc.Gateways))
	for i, g := range doc.Gateways {
		out[i], _ = json.Marshal(g)
	}
	return out
}

// overlaid applies overlays to a decoded file: an overlay replaces the
// file's gateway of the same id or adds one; a tombstone removes it.
// strict names the overlay being changed by an admin request: it is decoded
// strictly, every other one leniently. It returns the overlays that could
// not be decoded, by id.
func overlaid(f *File, data []byte, ovs map[string]Overlay, strict string) map[string]error {
	docs := fileGatewayDocs(data)
	for i := range f.Gateways {
		f.Gateways[i].source = SourceFile
		if i < len(docs) {
			f.Gateways[i].doc = docs[i]
		}
	}
	bad := map[string]error{}
	ids := make([]string, 0, len(ovs))
	for id := range ovs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		o := ovs[id]
		at := -1
		for i := range f.Gateways {
			if f.Gateways[i].ID == id {
				at = i
			}
		}
		if o.Tombstone {
			if at >= 0 {
				f.Gateways = append(f.Gateways[:at], f.Gateways[at+1:]...)
			}
			continue
		}
		gs, err := decodeGateway(o.Doc, id != strict)
		if err == nil && gs.ID != id {
			err = &ConfigError{Problems: []string{fmt.Sprintf("id: is %q; the id of a gateway cannot change (%q)", gs.ID, id)}}
		}
		if err != nil {
			bad[id] = err
			continue
		}
		if at >= 0 {
			f.Gateways[at] = *gs
		} else {
			f.Gateways = append(f.Gateways, *gs)
		}
	}
	return bad
}
