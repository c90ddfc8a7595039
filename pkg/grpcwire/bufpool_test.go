package grpcwire

import "testing"

// A buffer goes back to its pool and out again without an allocation (a
// put cost one before: the slice header boxed into the pool's interface),
// keeping its class's capacity and the length asked for. The poison
// build never hands a buffer out again (TestThePoisonBuildNeverReusesABuffer):
// there, each get is one allocation, by design.
func TestBufferPoolAllocatesNothing(t *testing.T) {
	want := 0.0
	if poisonBuffers {
		want = 1
	}
	for _, n := range []int{1, 1 << 10, 3000, 8 << 10, 40 << 10} {
		putBuf(getBuf(n))
		allocs := testing.AllocsPerRun(200, func() {
			b := getBuf(n)
			if len(b) != n || cap(b) < n {
				t.Fatalf("getBuf(%d): len %d cap %d", n, len(b), cap(b))
			}
			putBuf(b)
		})
		if allocs != want {
			t.Errorf("getBuf/putBuf of %d bytes: %.1f allocations, want %.0f", n, allocs, want)
		}
	}
}
