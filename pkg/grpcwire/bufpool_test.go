package grpcwire

import "testing"

// A buffer goes back to its pool and out again without an allocation (a
// put cost one before: the slice header boxed into the pool's interface),
// keeping its class's capacity and the length asked for.
func TestBufferPoolAllocatesNothing(t *testing.T) {
	for _, n := range []int{1, 1 << 10, 3000, 8 << 10, 40 << 10} {
		putBuf(getBuf(n))
		allocs := testing.AllocsPerRun(200, func() {
			b := getBuf(n)
			if len(b) != n || cap(b) < n {
				t.Fatalf("getBuf(%d): len %d cap %d", n, len(b), cap(b))
			}
			putBuf(b)
		})
		if allocs != 0 {
			t.Errorf("getBuf/putBuf of %d bytes: %.1f allocations, want 0", n, allocs)
		}
	}
}
