package breaker

import (
	"sync"
	"sync/atomic"
)

// Journal keeps the last transitions this replica made, for the
// dashboard's incident timeline (SPEC R-API7): which route changed state,
// on what evidence, and what handled the next request of its gateway.
// It is bounded (a ring), and costs a decision one atomic load while no
// transition waits for its next request.
type Journal struct {
	mu      sync.Mutex
	ring    []JournalEntry
	next    int
	full    bool
	waiting atomic.Int32 // entries whose Next is still empty
}

// JournalEntry is one transition and what came of it.
type JournalEntry struct {
	At             float64 `json:"at"` // unix seconds
	Gateway        string  `json:"gateway"`
	Route          string  `json:"route"`
	Scope          Scope   `json:"scope"`
	Transition     string  `json:"transition"`
	Reason         string  `json:"reason"`
	Failures       int     `json:"failures"`
	Threshold      int     `json:"threshold"`
	WindowCalls    int64   `json:"window_calls"`
	WindowFailures int64   `json:"window_failures"`
	PolicyVersion  string  `json:"policy_version"`
	// Next is what handled the gateway's next request for a model this
	// route serves, once one came: the route chosen and the action.
	Next *JournalNext `json:"next"`
}

// JournalNext is the decision after a transition.
type JournalNext struct {
	Model  string  `json:"model"`
	Route  string  `json:"route"` // "" when no route took it (fail_fast)
	Action string  `json:"action"`
	At     float64 `json:"at"`
}

// NewJournal keeps the last n transitions.
func NewJournal(n int) *Journal { return &Journal{ring: make([]JournalEntry, n)} }

// Add records a transition.
func (j *Journal) Add(e Event) {
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.full && j.ring[j.next].Next == nil {
		j.waiting.Add(-1) // overwritten while still waiting
	}
	j.ring[j.next] = JournalEntry{At: float64(e.At) / 1e9, Gateway: e.ID.Gateway, Route: e.ID.Route, Scope: e.ID.Scope,
		Transition: e.Transition(), Reason: e.Reason, Failures: e.Failures, Threshold: e.Threshold,
		WindowCalls: e.WindowCalls, WindowFailures: e.WindowFailures, PolicyVersion: e.PolicyVersion}
	j.waiting.Add(1)
	j.next = (j.next + 1) % len(j.ring)
	j.full = j.full || j.next == 0
}

// Decided tells the journal of a decision: gateway gw's model chose route
// (or none) by action, among candidates (route keys). Entries of that
// gateway still waiting, for a route among the candidates (or a fleet),
// take it as their next request.
func (j *Journal) Decided(gw, model, route, action string, candidates func(key string) bool, now int64) {
	if j == nil || j.waiting.Load() == 0 {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range j.ring {
		e := &j.ring[i]
		if e.Transition == "" || e.Next != nil || e.Gateway != gw && e.Scope != ScopeGlobal {
			continue
		}
		if e.Scope == ScopeGateway && !candidates(e.Route) {
			continue
		}
		e.Next = &JournalNext{Model: model, Route: route, Action: action, At: float64(now) / 1e9}
		j.waiting.Add(-1)
	}
}

// Recent returns up to n entries, newest first.
func (j *Journal) Recent(n int) []JournalEntry {
	out := []JournalEntry{}
	if j == nil {
		return out
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	size := j.next
	if j.full {
		size = len(j.ring)
	}
	for k := 0; k < size && len(out) < n; k++ {
		i := (j.next - 1 - k + len(j.ring)) % len(j.ring)
		e := j.ring[i]
		if e.Next != nil {
			nx := *e.Next
			e.Next = &nx
		}
		out = append(out, e)
	}
	return out
}

// Waiting reports whether a transition waits for its next request: the
// decision path asks this (one atomic load) before it builds anything.
func (j *Journal) Waiting() bool { return j != nil && j.waiting.Load() > 0 }
