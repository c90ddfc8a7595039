package routes

import "sync/atomic"

// Holder publishes the Runtime in force. Readers take one pointer per
// request and keep it for the request's life; a reload swaps it atomically.
type Holder struct {
	p atomic.Pointer[Runtime]
}

// NewHolder returns a Holder holding rt.
func NewHolder(rt *Runtime) *Holder {
	h := &Holder{}
	h.p.Store(rt)
	return h
}

// Load returns the Runtime in force.
func (h *Holder) Load() *Runtime { return h.p.Load() }

// Store replaces the Runtime in force.
func (h *Holder) Store(rt *Runtime) { h.p.Store(rt) }
