package grpcwire

import (
	"sync"
	"unsafe"
)

// Received messages' buffers, pooled by size class (a pool of mixed
// sizes handed an 8 KiB message a 1 KiB buffer, dropped it, and made a
// new one).
var bufClasses = [...]int{1 << 10, 4 << 10, 16 << 10, 64 << 10}

var bufPools [len(bufClasses)]sync.Pool

// A pool holds each buffer as the pointer to its first byte: a pointer
// goes into an interface without an allocation, where a slice (or the
// address of a local slice header, as before) cost one per put, a
// million objects in a 10 s observer profile. The class gives the length
// back.
func getBuf(n int) []byte {
	for i, c := range bufClasses {
		if n <= c {
			if p, ok := bufPools[i].Get().(*byte); ok {
				return unsafe.Slice(p, c)[:n]
			}
			return make([]byte, n, c)
		}
	}
	return make([]byte, n)
}

func putBuf(b []byte) {
	if poisonBuffers {
		// Poisoned and never handed out again: a buffer the pool gave
		// to the next message would fill a kept alias with that
		// message's bytes, which a test can read as right (and the
		// poison written when that message's buffer is given back
		// races the alias's read instead of failing it).
		poison(b[:cap(b)])
		return
	}
	for i, c := range bufClasses {
		if cap(b) == c {
			bufPools[i].Put(unsafe.SliceData(b[:c]))
			return
		}
	}
}

// poison overwrites b (the poison build, poison_on.go).
func poison(b []byte) {
	for i := range b {
		b[i] = 0xdb
	}
}
