package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Notes (breaker/notes.go): compare-and-set on a missing, matching or
// different value; delete; exactly one of many concurrent claimants wins;
// a note expires.
func testNotes(t *testing.T, f Factory) {
	r := newRig(t, f, pol(nil))
	st := r.st
	name := fmt.Sprintf("n-%d", time.Now().UnixNano())
	steps := []struct {
		what       string
		prev, next string // "" = nil
		wantOK     bool
		wantCur    string
	}{
		{"create when absent", "", "a", true, ""},
		{"create again fails and tells", "", "b", false, "a"},
		{"wrong prev fails and tells", "x", "b", false, "a"},
		{"matching prev replaces", "a", "b", true, ""},
		{"delete with matching prev", "b", "", true, ""},
		{"absent reads as absent", "", "", true, ""},
	}
	b := func(s string) []byte {
		if s == "" {
			return nil
		}
		return []byte(s)
	}
	for _, s := range steps {
		cur, ok, err := st.SwapNote(ctx, name, b(s.prev), b(s.next), time.Minute)
		if err != nil || ok != s.wantOK || string(cur) != s.wantCur {
			t.Fatalf("%s: got (%q, %v, %v), want (%q, %v)", s.what, cur, ok, err, s.wantCur, s.wantOK)
		}
	}
	// Concurrent claims of one note: exactly one deletes it.
	if _, ok, err := st.SwapNote(ctx, name, nil, []byte("parked"), time.Minute); !ok || err != nil {
		t.Fatalf("park: %v %v", ok, err)
	}
	var won atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok, err := st.SwapNote(ctx, name, []byte("parked"), nil, time.Minute); ok && err == nil {
				won.Add(1)
			}
		}()
	}
	wg.Wait()
	if won.Load() != 1 {
		t.Fatalf("%d claimants won, want 1", won.Load())
	}
	// Expiry (Redis's PX, the table's wall clock): reclaimed memory only,
	// so a real short TTL and a poll, not a fake clock.
	if _, ok, _ := st.SwapNote(ctx, name+"x", nil, []byte("v"), 30*time.Millisecond); !ok {
		t.Fatal("create")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok, _ := st.SwapNote(ctx, name+"x", nil, nil, time.Minute); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the note never expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
