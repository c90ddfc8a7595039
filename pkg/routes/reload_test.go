package routes

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestReloadGoodBadGood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fusebox.yaml")
	write := func(doc string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		// Explicit mtimes: the poll must not depend on the clock's resolution.
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(1_700_000_000, 0)
	write(baseYAML, t0)
	rt, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHolder(rt)
	var mu sync.Mutex
	results := map[string]int{}
	r := &Reloader{Path: path, Holder: h, OnResult: func(s string) { mu.Lock(); results[s]++; mu.Unlock() }}
	r.Prime()

	if attempted, _ := r.Check(); attempted {
		t.Fatal("unchanged file must not reload")
	}
	first := h.Load()

	// Good → bad: refused, the last good config stays.
	write(strings.Replace(baseYAML, "failure_threshold: 10", "failure_threshold: 0", 1), t0.Add(time.Second))
	attempted, err := r.Check()
	if !attempted || err == nil {
		t.Fatalf("bad file: attempted=%v err=%v", attempted, err)
	}
	if h.Load() != first {
		t.Fatal("a bad file replaced the config")
	}

	// Bad → good: swapped.
	good := strings.Replace(baseYAML, "failure_threshold: 10", "failure_threshold: 4", 1)
	write(good, t0.Add(2*time.Second))
	if attempted, err := r.Check(); !attempted || err != nil {
		t.Fatalf("good file: attempted=%v err=%v", attempted, err)
	}
	second := h.Load()
	if second == first || second.Gateways["default"].Policy.FailureThreshold != 4 {
		t.Fatal("good file not applied")
	}
	// A request in flight keeps the Runtime it started with.
	if first.Gateways["default"].Policy.FailureThreshold != 10 {
		t.Fatal("old runtime was mutated")
	}

	// SIGHUP path with a broken file.
	write("gateways: [", t0.Add(3*time.Second))
	if err := r.Reload(); err == nil {
		t.Fatal("Reload accepted a broken file")
	}
	if h.Load() != second {
		t.Fatal("broken file replaced config")
	}
	mu.Lock()
	defer mu.Unlock()
	if results[ReloadSuccess] != 1 || results[ReloadError] != 2 {
		t.Fatalf("results %v", results)
	}
}

func TestReloaderReportsFallbackOncePerVersion(t *testing.T) {
	doc := cfg(`{failure_status_codes: "x"}`, "", "")
	rt, err := Parse([]byte(doc), Options{Lenient: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	r := &Reloader{OnFallback: func(Fallback) { n++ }}
	r.Report(rt)
	first := n
	if first == 0 {
		t.Fatal("no fallback reported")
	}
	rt2, _ := Parse([]byte(doc), Options{Lenient: true})
	r.Report(rt2)
	if n != first {
		t.Fatalf("fallback reported again for the same policy version: %d → %d", first, n)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(baseYAML))
	f.Add(defaultYAML)
	f.Add([]byte(cfg(`{failure_status_codes: [500.0, "x"], mode: shadow}`, `{policy: conservative}`, `{}`)))
	f.Add([]byte("gateways: [{id: a}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rt, err := Parse(data, Options{})
		if err != nil {
			if rt != nil {
				t.Fatal("runtime with error")
			}
			return
		}
		// Any accepted config is internally consistent.
		for _, g := range rt.Gateways {
			for _, m := range g.Models {
				for _, r := range m.Candidates(nil) {
					if r.Policy == nil || len(r.Policy.Version) != 8 {
						t.Fatal("route without resolved policy")
					}
					for _, c := range r.Policy.FailureStatusCodes {
						if c < 100 || c > 599 {
							t.Fatalf("accepted status %d", c)
						}
					}
					if r.Policy.FailureThreshold < 1 || r.Policy.WindowSec < 1 || r.Policy.CooldownMs < 1 {
						t.Fatal("accepted out-of-range policy")
					}
				}
			}
		}
		// A lenient load never refuses what a strict one accepts.
		if _, err := Parse(data, Options{Lenient: true}); err != nil {
			t.Fatalf("lenient refused a valid doc: %v", err)
		}
	})
}

func FuzzStatusCodes(f *testing.F) {
	for _, s := range []string{"[500, 502]", "null", "{}", `"500"`, "500", "[500.0]", "[500.5]", "{a: 1}", "[[1]]", "[]", "[1e3]", "[0x1f4]", "[-500]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte("v: "+s), &n); err != nil || len(n.Content) == 0 || len(n.Content[0].Content) < 2 {
			return
		}
		codes, set, err := ParseStatusCodes(n.Content[0].Content[1])
		if err != nil {
			if set || codes != nil {
				t.Fatal("error with a result")
			}
			return
		}
		if !set && codes != nil {
			t.Fatal("unset with codes")
		}
		for _, c := range codes {
			if c < 100 || c > 599 {
				t.Fatalf("accepted %d from %q", c, s)
			}
		}
	})
}
