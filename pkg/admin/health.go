package admin

import (
	"sync"
)

// Health tracks readiness per component (config, listeners, store) and the
// draining flag set on SIGTERM (R-API6). Components report themselves; the
// /readyz handler and grpc.health.v1 read it.
type Health struct {
	mu         sync.Mutex
	components map[string]Component
	draining   bool
	onChange   []func(serving bool)
}

// Component is one part's readiness.
type Component struct {
	Ready bool `json:"ready"`
	// Degraded means working on a fallback (e.g. the store is down and
	// fusebox decides on local state): still ready.
	Degraded bool   `json:"degraded,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// NewHealth returns a Health with the named components not ready.
func NewHealth(components ...string) *Health {
	h := &Health{components: map[string]Component{}}
	for _, c := range components {
		h.components[c] = Component{Detail: "starting"}
	}
	return h
}

// Set records a component's state.
func (h *Health) Set(name string, c Component) {
	h.mu.Lock()
	h.components[name] = c
	fns, serving := h.snapshotLocked()
	h.mu.Unlock()
	for _, f := range fns {
		f(serving)
	}
}

// OnChange registers f, called with the serving state after every change.
func (h *Health) OnChange(f func(serving bool)) {
	h.mu.Lock()
	h.onChange = append(h.onChange, f)
	_, serving := h.snapshotLocked()
	h.mu.Unlock()
	f(serving)
}

// Drain marks fusebox as shutting down: not serving from now on.
func (h *Health) Drain() {
	h.mu.Lock()
	h.draining = true
	fns, serving := h.snapshotLocked()
	h.mu.Unlock()
	for _, f := range fns {
		f(serving)
	}
}

func (h *Health) snapshotLocked() ([]func(bool), bool) {
	return append([]func(bool){}, h.onChange...), h.servingLocked()
}

func (h *Health) servingLocked() bool {
	if h.draining {
		return false
	}
	for _, c := range h.components {
		if !c.Ready {
			return false
		}
	}
	return true
}

// Report is the /readyz body.
type Report struct {
	Ready      bool                 `json:"ready"`
	Draining   bool                 `json:"draining"`
	Components map[string]Component `json:"components"`
}

// Report returns the current readiness.
func (h *Health) Report() Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := Report{Ready: h.servingLocked(), Draining: h.draining, Components: map[string]Component{}}
	for k, v := range h.components {
		r.Components[k] = v
	}
	return r
}
