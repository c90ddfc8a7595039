package routes

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// RFC 7396's own examples (appendix A).
func TestMergePatch(t *testing.T) {
	cases := []struct{ target, patch, want string }{
		{`{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
		{`{"a":"b"}`, `{"a":null}`, `{}`},
		{`{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
		{`{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
		{`{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
		{`["a","b"]`, `["c","d"]`, `["c","d"]`},
		{`{"a":"b"}`, `["c"]`, `["c"]`},
		{`{"a":"foo"}`, `null`, `null`},
		{`{"e":null}`, `{"a":1}`, `{"a":1,"e":null}`},
		{`[1,2]`, `{"a":"b","c":null}`, `{"a":"b"}`},
		{`{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
	}
	for _, tc := range cases {
		var target, patch any
		_ = json.Unmarshal([]byte(tc.target), &target)
		_ = json.Unmarshal([]byte(tc.patch), &patch)
		got, _ := json.Marshal(mergePatch(target, patch))
		if string(got) != tc.want {
			t.Errorf("%s + %s = %s, want %s", tc.target, tc.patch, got, tc.want)
		}
	}
}

func TestFileOverlays(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "overlays.json")
	f := &FileOverlays{Path: path}
	if set, err := f.Load(ctx); err != nil || len(set) != 0 {
		t.Fatalf("missing file: %v %v", set, err)
	}
	if err := f.Save(ctx, "g", &Overlay{Doc: json.RawMessage(`{"id":"g"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(ctx, "h", &Overlay{Tombstone: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(ctx, "g", nil); err != nil {
		t.Fatal(err)
	}
	set, err := (&FileOverlays{Path: path}).Load(ctx)
	if err != nil || len(set) != 1 || !set["h"].Tombstone {
		t.Fatalf("reloaded %v %v", set, err)
	}
	// No temporary file is left behind.
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Fatalf("%d files in the directory", len(entries))
	}
	// A corrupt file and the leftovers of an interrupted write: the file
	// is moved aside and counted, the leftovers removed, and Load starts
	// empty rather than failing the start.
	if err := os.WriteFile(path, []byte("{nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(filepath.Dir(path), ".overlays.json.123456")
	if err := os.WriteFile(left, []byte(`{"version":1`), 0o600); err != nil {
		t.Fatal(err)
	}
	corrupt := 0
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	set, err = (&FileOverlays{Path: path, OnCorrupt: func() { corrupt++ }, Now: func() time.Time { return at }}).Load(ctx)
	if err != nil || len(set) != 0 || corrupt != 1 {
		t.Fatalf("corrupt file: set %v, err %v, counted %d", set, err, corrupt)
	}
	if b, err := os.ReadFile(path + ".corrupt-20261201T100000.000000000Z"); err != nil || string(b) != "{nope" {
		t.Fatalf("moved aside: %q %v", b, err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the leftover temporary file is still there: %v", err)
	}
	// A directory that cannot be written: the change is refused, and the
	// set in memory is unchanged.
	ro := &FileOverlays{Path: filepath.Join(t.TempDir(), "missing-dir", "o.json")}
	_, _ = ro.Load(ctx)
	if err := ro.Save(ctx, "g", &Overlay{}); err == nil {
		t.Fatal("a failed write reported success")
	}
}

// Admin bodies: decoding a gateway document and merging a patch never
// panic, whatever the bytes.
func FuzzGatewayDocument(f *testing.F) {
	for _, s := range []string{`{"id":"g","circuit_breaker":{"failure_status_codes":[500]}}`, `{"models":[{"name":"m","routes":["a:b:c"]}]}`, `[]`, `null`, `{"circuit_breaker":{"failure_threshold":1e400}}`, "a: [", `{"id":1}`} {
		f.Add([]byte(s), []byte(`{"circuit_breaker":{"enabled":true}}`))
	}
	f.Fuzz(func(t *testing.T, doc, patch []byte) {
		_, _ = decodeGateway(doc, false)
		_, _ = decodeGateway(doc, true)
		if obj, err := jsonObject(doc); err == nil {
			if p, err := jsonObject(patch); err == nil {
				out := mergePatch(any(obj), any(p))
				if _, err := json.Marshal(out); err != nil {
					t.Fatalf("merge result does not marshal: %v", err)
				}
			}
		}
	})
}
