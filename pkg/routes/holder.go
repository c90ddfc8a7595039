package routes

import (
	"sync"
	"sync/atomic"
)

// Holder publishes the Runtime in force. Readers take one pointer per
// request and keep it for the request's life; a reload swaps it atomically.
type Holder struct {
	p     atomic.Pointer[Runtime]
	mu    sync.Mutex // serialises Store and OnSwap
	hooks []func(*Runtime)
}

// NewHolder returns a Holder holding rt.
func NewHolder(rt *Runtime) *Holder {
	h := &Holder{}
	h.p.Store(rt)
	return h
}

// Load returns the Runtime in force.
func (h *Holder) Load() *Runtime { return h.p.Load() }

// Store replaces the Runtime in force. Every OnSwap hook runs first, so
// that what a Runtime needs (its breakers and policies) is in place before
// any request can see it.
func (h *Holder) Store(rt *Runtime) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fn := range h.hooks {
		fn(rt)
	}
	h.p.Store(rt)
}

// OnSwap registers fn to run for the Runtime in force now and before every
// later swap.
func (h *Holder) OnSwap(fn func(*Runtime)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hooks = append(h.hooks, fn)
	fn(h.p.Load())
}
