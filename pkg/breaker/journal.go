package breaker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strconv"
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
	replica string       // names this replica's entries in a fleet's journal
	seq     uint64
}

// JournalEntry is one transition and what came of it.
type JournalEntry struct {
	// ID is unique in the fleet (the replica and its count), so that the
	// fleet's journal and this replica's merge without a repeat.
	ID         string  `json:"id"`
	Replica    string  `json:"replica"`
	At         float64 `json:"at"` // unix seconds
	Gateway    string  `json:"gateway"`
	Route      string  `json:"route"`
	Scope      Scope   `json:"scope"`
	Transition string  `json:"transition"`
	Reason     string  `json:"reason"`
	// Origin is the evidence's origin (R-FD1: local, upstream; "" when
	// the reason is none's alone, TransitionOrigin).
	Origin         string `json:"origin,omitempty"`
	Failures       int    `json:"failures"`
	Threshold      int    `json:"threshold"`
	WindowCalls    int64  `json:"window_calls"`
	WindowFailures int64  `json:"window_failures"`
	PolicyVersion  string `json:"policy_version"`
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

// NewJournal keeps the last n transitions. Its entries name a random
// replica id (SetReplica gives the store's).
func NewJournal(n int) *Journal {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &Journal{ring: make([]JournalEntry, n), replica: hex.EncodeToString(b[:])}
}

// Replica is the name this replica's entries carry.
func (j *Journal) Replica() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.replica
}

// SetReplica names this replica in the entries made from now on.
func (j *Journal) SetReplica(id string) {
	j.mu.Lock()
	j.replica = id
	j.mu.Unlock()
}

// Add records a transition and returns its entry.
func (j *Journal) Add(e Event) JournalEntry {
	if j == nil {
		return JournalEntry{}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.full && j.ring[j.next].Next == nil {
		j.waiting.Add(-1) // overwritten while still waiting
	}
	j.seq++
	j.ring[j.next] = JournalEntry{ID: j.replica + ":" + strconv.FormatUint(j.seq, 10), Replica: j.replica,
		At: float64(e.At) / 1e9, Gateway: e.ID.Gateway, Route: e.ID.Route, Scope: e.JournalScope(),
		Transition: e.Transition(), Reason: e.Reason, Origin: TransitionOrigin(e.Reason), Failures: e.Failures, Threshold: e.Threshold,
		WindowCalls: e.WindowCalls, WindowFailures: e.WindowFailures, PolicyVersion: e.PolicyVersion}
	out := j.ring[j.next]
	j.waiting.Add(1)
	j.next = (j.next + 1) % len(j.ring)
	j.full = j.full || j.next == 0
	return out
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
		if (e.Scope == ScopeGateway || e.Scope == ScopeReplica) && !candidates(e.Route) {
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

// FleetJournalLen bounds a fleet's journal: the last 256 transitions of
// every replica together.
const FleetJournalLen = 256

// FleetJournal is a store that keeps a fleet's last transitions, so that
// every replica's incident view shows every replica's (the Redis store;
// the memory store's fleet is one replica, whose Journal is all of it).
// An entry is the JSON of a JournalEntry; the store keeps the newest
// FleetJournalLen.
type FleetJournal interface {
	// AppendJournal adds entries, oldest first, in one round trip: a
	// replica writes what its transitions made since its last write.
	AppendJournal(ctx context.Context, entries ...[]byte) error
	// RecentJournal returns up to n entries, newest first.
	RecentJournal(ctx context.Context, n int) ([][]byte, error)
}

// MergeJournals returns up to n entries of this replica's journal and the
// fleet's, newest first, each once: an entry this replica made is taken
// from its own journal, which knows what handled the next request.
// Entries that do not decode are left out.
func MergeJournals(local []JournalEntry, fleet [][]byte, n int) []JournalEntry {
	seen := make(map[string]bool, len(local))
	out := append(make([]JournalEntry, 0, len(local)+len(fleet)), local...)
	for _, e := range local {
		seen[e.ID] = true
	}
	for _, raw := range fleet {
		var e JournalEntry
		if json.Unmarshal(raw, &e) != nil || e.ID == "" || seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		out = append(out, e)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].At > out[b].At })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// journalRing is the memory store's FleetJournal: the newest
// FleetJournalLen entries.
type journalRing struct {
	mu   sync.Mutex
	ring [FleetJournalLen][]byte
	n    int // entries ever appended
}

// AppendJournal implements FleetJournal.
func (s *Memory) AppendJournal(_ context.Context, entries ...[]byte) error {
	r := &s.journal
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, entry := range entries {
		r.ring[r.n%FleetJournalLen] = append([]byte(nil), entry...)
		r.n++
	}
	return nil
}

// RecentJournal implements FleetJournal.
func (s *Memory) RecentJournal(_ context.Context, n int) ([][]byte, error) {
	r := &s.journal
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]byte
	for i := r.n - 1; i >= 0 && i >= r.n-FleetJournalLen && len(out) < n; i-- {
		out = append(out, append([]byte(nil), r.ring[i%FleetJournalLen]...))
	}
	return out, nil
}
