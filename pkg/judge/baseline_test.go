package judge

import (
	"math/rand"
	"testing"
	"time"
	"unsafe"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// testT0 is the tests' fixed start.
var testT0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// R-T6: memory per route stays bounded, whatever it records, and
// recording allocates nothing.
func TestBaselineMemoryBounded(t *testing.T) {
	b := NewBaselines()
	id := breaker.RouteID("g", "p:r:m")
	now := testT0.UnixNano()
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 1_000_000; i++ {
		b.Add(id, rng.Int63n(600_000), now+int64(i)*int64(time.Millisecond))
	}
	if len(b.m) != 1 || unsafe.Sizeof(*b.m[id]) > 5<<10 {
		t.Fatalf("%d routes, %d bytes", len(b.m), unsafe.Sizeof(*b.m[id]))
	}
	if n := testing.AllocsPerRun(1000, func() { b.Add(id, 120, now) }); n != 0 {
		t.Fatalf("add allocates %v", n)
	}
	// No baseline before 20 successes.
	fresh := NewBaselines()
	for i := 0; i < 19; i++ {
		fresh.Add(id, 100, now)
	}
	if got := fresh.P50(id, now); got != 0 {
		t.Fatalf("a Baseline from 19 successes: %d", got)
	}
	fresh.Add(id, 100, now)
	if got := fresh.P50(id, now+2e9); got < 88 || got > 112 {
		t.Fatalf("baseline from 20 successes: %d", got)
	}
}

// R-D8 with slow_call_baseline_multiplier: while the route's recent p50 is
// above its baseline × multiplier, the ramp's share stops growing; once it
// is fast again the share is the breaker's.
func TestRampHeldWhileSlow(t *testing.T) {
	x := &Baseline{}
	t0 := testT0.UnixNano()
	for m := int64(0); m < 14; m++ {
		for range 30 {
			x.Add(100, t0+m*60e9) // the baseline: 100 ms
		}
	}
	now := t0 + 14*60e9
	if got := x.RampShare(300, 2, now); got != 300 {
		t.Fatalf("fast: %d, want the breaker's 300", got)
	}
	for range 40 {
		x.Add(900, now) // recently 900 ms: more than 2 × the baseline
	}
	if got := x.RampShare(300, 2, now); got != 300 {
		t.Fatalf("slow, first: %d", got)
	}
	if got := x.RampShare(600, 2, now+1e9); got != 300 {
		t.Fatalf("slow: the share grew to %d, want held at 300", got)
	}
	later := now + 3*60e9 // the slow minutes are no longer recent
	for range 20 {
		x.Add(100, later)
	}
	if got := x.RampShare(800, 2, later); got != 800 {
		t.Fatalf("fast again: %d, want 800", got)
	}
}

// bucketOf's shortcut agrees with a plain search on every latency.
func TestBucketOf(t *testing.T) {
	for ms := int64(0); ms < 2_000_000; ms += 1 + ms/1000 {
		want := 0
		for want < len(bucketBounds) && bucketBounds[want] <= ms {
			want++
		}
		if got := bucketOf(ms); got != want {
			t.Fatalf("bucketOf(%d) = %d, want %d", ms, got, want)
		}
	}
}
