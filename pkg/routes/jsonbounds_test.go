package routes

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCheckJSONBounds(t *testing.T) {
	items := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("1,", n), ",") + "]" }
	cases := []struct {
		name string
		body string
		ok   bool
	}{
		{"flat object", `{"a":1,"b":[1,2,3],"c":{"d":"x"}}`, true},
		{"64 deep", strings.Repeat("[", 64) + strings.Repeat("]", 64), true},
		{"65 deep", strings.Repeat("[", 65) + strings.Repeat("]", 65), false},
		{"9,990 deep (the probe's)", strings.Repeat(`{"a":`, 9990) + "1" + strings.Repeat("}", 9990), false},
		{"brackets in strings do not nest", `{"a":"` + strings.Repeat("[{", 1000) + `"}`, true},
		{"escaped quotes stay in the string", `{"a":"\"[[[[\"","b":1}`, true},
		{"10,000 elements", items(10000), true},
		{"10,001 elements", items(10001), false},
		{"commas in strings are not elements", `["` + strings.Repeat(",", 20000) + `"]`, true},
		{"empty containers count nothing", strings.Repeat("[],", 4999) + "[]", true},
	}
	for _, c := range cases {
		err := CheckJSONBounds([]byte(c.body))
		var be *JSONBoundsError
		if c.ok != (err == nil) || (err != nil && !errors.As(err, &be)) {
			t.Errorf("%s: err = %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// TestDeepPatchRefusedBeforeDecoding: the probe's 9,990-deep PATCH is 400
// before it is decoded or takes the config lock; before the fix it was
// decoded, merged and compiled under the lock (4.2 s of CPU, 900 MB).
func TestDeepPatchRefusedBeforeDecoding(t *testing.T) {
	m, _ := newTestManager(t)
	deep := `{"circuit_breaker":` + strings.Repeat(`{"a":`, 9990) + "1" + strings.Repeat("}", 9990) + `}`
	m.mu.Lock() // held: a body refused before the lock still answers
	done := make(chan error, 1)
	go func() { _, err := m.Patch(t.Context(), "default", []byte(deep)); done <- err }()
	err := <-done
	m.mu.Unlock()
	var be *JSONBoundsError
	if !errors.As(err, &be) {
		t.Fatalf("err = %v, want a JSONBoundsError", err)
	}
}

// FuzzCheckJSONBounds: the scan never panics, and accepts every valid JSON
// value within the bounds that encoding/json decodes.
func FuzzCheckJSONBounds(f *testing.F) {
	for _, s := range []string{`{}`, `[1,[2,{"a":"]"}]]`, `"\\"`, `{"a":[` + strings.Repeat("[", 70)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := CheckJSONBounds(b)
		var v any
		if err != nil || json.Unmarshal(b, &v) != nil {
			return
		}
		// Accepted and valid: re-encoded, it is accepted too.
		again, _ := json.Marshal(v)
		if CheckJSONBounds(again) != nil {
			t.Fatalf("accepted %q but refused its re-encoding %q", b, again)
		}
	})
}

func newTestManager(t *testing.T) (*Manager, *Holder) {
	t.Helper()
	m := &Manager{Store: &FileOverlays{}}
	rt, err := m.Open(t.Context(), []byte(baseYAML))
	if err != nil {
		t.Fatal(err)
	}
	m.Holder = NewHolder(rt)
	return m, m.Holder
}
