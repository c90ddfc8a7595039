package breaker

import (
	"testing"
	"time"
)

// R-L9: the coarse clock stops ticking when nobody reads it and starts
// again on the next read, which is never stale.
func TestCoarseClockIdles(t *testing.T) {
	c := newCoarseClock(time.Millisecond, 20*time.Millisecond)
	defer c.Stop()
	if c.Ticking() {
		t.Fatal("ticking before the first read")
	}
	before := time.Now()
	if got := c.Now(); got.Before(before) {
		t.Fatalf("first read %v is older than %v", got, before)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !c.Ticking() {
		if time.Now().After(deadline) {
			t.Fatal("a read did not wake the ticker")
		}
		time.Sleep(time.Millisecond)
	}
	// While read, it stays within a few resolutions of the wall clock.
	for i := 0; i < 50; i++ {
		if d := time.Since(c.Now()); d > 50*time.Millisecond {
			t.Fatalf("stale by %v while ticking", d)
		}
		time.Sleep(time.Millisecond)
	}
	// Unread, it parks.
	deadline = time.Now().Add(5 * time.Second)
	for c.Ticking() {
		if time.Now().After(deadline) {
			t.Fatal("the ticker kept running with nobody reading")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond)
	before = time.Now()
	if got := c.Now(); got.Before(before) {
		t.Fatalf("the first read after idling is stale: %v < %v", got, before)
	}
}
