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
	clock := t0
	r := &Reloader{Path: path, Holder: h, OnResult: func(s string) { mu.Lock(); results[s]++; mu.Unlock() }, Now: func() time.Time { return clock }}
	r.Prime()
	// poll is the poller: the first sighting of a change waits, the poll
	// after the settle time applies it.
	poll := func() (bool, error) {
		t.Helper()
		if attempted, err := r.Check(); attempted {
			return attempted, err
		}
		clock = clock.Add(2 * time.Second)
		return r.Check()
	}

	if attempted, _ := r.Check(); attempted {
		t.Fatal("unchanged file must not reload")
	}
	first := h.Load()

	// Good → bad: refused, the last good config stays.
	write(strings.Replace(baseYAML, "failure_threshold: 10", "failure_threshold: 0", 1), t0.Add(time.Second))
	attempted, err := poll()
	if !attempted || err == nil {
		t.Fatalf("bad file: attempted=%v err=%v", attempted, err)
	}
	if h.Load() != first {
		t.Fatal("a bad file replaced the config")
	}

	// Bad → good: swapped.
	good := strings.Replace(baseYAML, "failure_threshold: 10", "failure_threshold: 4", 1)
	write(good, t0.Add(2*time.Second))
	if attempted, err := poll(); !attempted || err != nil {
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

// R-L7: a file written in place in two parts, 1.5 s apart, is never
// applied half-written; the poll applies it once it has settled, and SIGHUP
// at once.
func TestReloadWaitsForTheFileToSettle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(path, []byte(baseYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	rt, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHolder(rt)
	clock := time.Unix(1_700_000_000, 0)
	r := &Reloader{Path: path, Holder: h, Now: func() time.Time { return clock }}
	r.Prime()
	full := baseYAML + "  - id: second\n    circuit_breaker: {enabled: true}\n    models: [{name: m, routes: [\"p:r:m\"]}]\n    routes: [{key: \"p:r:m\", cluster: c}]\n"
	mod := time.Unix(1_700_000_100, 0)
	writeAt := func(doc string) {
		mod = mod.Add(time.Second)
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		_ = os.Chtimes(path, mod, mod)
	}
	// The dangerous half is one that is valid on its own: here, the
	// document without its second gateway.
	writeAt(baseYAML + "# part one of two\n")
	for i := 0; i < 2; i++ { // polls at 0 s and 1 s see part one
		if attempted, _ := r.Check(); attempted {
			t.Fatal("a file seen changed for under the settle time was applied")
		}
		clock = clock.Add(time.Second)
	}
	clock = clock.Add(-500 * time.Millisecond) // part two lands 1.5 s after part one
	writeAt(full)
	for i := 0; i < 2; i++ {
		if attempted, _ := r.Check(); attempted {
			t.Fatal("applied before settling")
		}
		clock = clock.Add(time.Second)
	}
	if attempted, err := r.Check(); !attempted || err != nil {
		t.Fatalf("settled file: attempted=%v err=%v", attempted, err)
	}
	if _, ok := h.Load().Gateways["second"]; !ok {
		t.Fatal("the whole file is not in force")
	}
	// SIGHUP does not wait.
	writeAt(baseYAML)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Load().Gateways["second"]; ok {
		t.Fatal("SIGHUP did not apply at once")
	}
}
