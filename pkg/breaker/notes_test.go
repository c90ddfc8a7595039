package breaker

import (
	"fmt"
	"testing"
	"time"
)

// Expired notes are reclaimed as the table is used, not only once it is
// full: a table that sees a note per request holds about a TTL's worth.
func TestNoteTableReclaimsExpiredNotes(t *testing.T) {
	clk := time.Unix(1764600000, 0)
	tab := NewNoteTable(1 << 17)
	tab.now = func() time.Time { return clk }
	for i := 0; i < 10000; i++ {
		if _, ok, err := tab.Swap(fmt.Sprint("a:", i), nil, []byte("x"), 3*time.Second); !ok || err != nil {
			t.Fatalf("note %d: %v %v", i, ok, err)
		}
		clk = clk.Add(time.Millisecond) // 1,000 notes a second
	}
	// 10 s of notes with a 3 s TTL: about 3,000 live, one second of slack.
	if n := tab.Len(); n > 4100 {
		t.Fatalf("%d notes kept after 10 s at 1,000 a second with a 3 s TTL", n)
	}
	// A live note is kept and reads back.
	if got, ok, _ := tab.Swap("a:9999", nil, []byte("y"), time.Second); ok || string(got) != "x" {
		t.Fatalf("the newest note: %q %v", got, ok)
	}
}

// A table nobody writes to any more empties at the sweep: the notes of a
// burst do not stay until the next request.
func TestNoteTableSweep(t *testing.T) {
	clk := time.Unix(1764600000, 0)
	tab := NewNoteTable(1 << 17)
	tab.now = func() time.Time { return clk }
	for i := 0; i < 100; i++ {
		_, _, _ = tab.Swap(fmt.Sprint("a:", i), nil, []byte("x"), 5*time.Second)
	}
	clk = clk.Add(6 * time.Second)
	tab.Sweep()
	if n := tab.Len(); n != 0 {
		t.Fatalf("%d expired notes kept after the sweep", n)
	}
	// And the emptied map is made again: a Go map keeps the buckets of
	// its largest size, which the observer soak's heap held after the load.
	if tab.peak != 0 {
		t.Fatalf("the emptied table keeps the map of its %d notes", tab.peak)
	}
}
