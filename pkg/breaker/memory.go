package breaker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Memory is the in-process Store (R-ST1).
type Memory struct {
	mu      sync.Mutex // serialises Install
	tab     atomic.Pointer[table]
	onEvent func(Event)
	notes   *NoteTable
	journal journalRing
}

// table is an installed set of breakers: by ID, and by the slot of the key
// handed out at Install. Immutable once published; Install publishes a new
// one.
type table struct {
	byID  map[ID]*machine
	slots []*machine // slot 0 unused
}

// NewMemory returns an empty memory store; onEvent (may be nil) receives
// every transition, in order per breaker, outside any breaker lock.
func NewMemory(onEvent func(Event)) *Memory {
	s := &Memory{onEvent: onEvent, notes: NewNoteTable(1 << 17)}
	s.tab.Store(&table{byID: map[ID]*machine{}, slots: []*machine{nil}})
	return s
}

// Install implements Store. A breaker keeps its key (and slot) for as long
// as it stays installed, so the keys of an older configuration still resolve
// on the fast path.
func (s *Memory) Install(_ context.Context, now int64, specs []Spec) ([]Key, []ID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.tab.Load()
	nt := &table{byID: make(map[ID]*machine, len(specs)), slots: []*machine{nil}}
	renumber := len(old.slots) > 2*len(specs)+64
	if !renumber {
		// Slots of removed breakers are not reused while keys may still
		// name them; after much churn everything is renumbered (older keys
		// then resolve by ID, still correctly).
		nt.slots = make([]*machine, len(old.slots))
	}
	keys := make([]Key, len(specs))
	for i, sp := range specs {
		if sp.Policy == nil {
			return nil, nil, fmt.Errorf("breaker: install %s: no policy", sp.ID.Route)
		}
		m, ok := nt.byID[sp.ID]
		if !ok {
			if m, ok = old.byID[sp.ID]; ok {
				m.install(sp.Policy, now)
				if !renumber {
					nt.slots[m.key.Slot()] = m
				} else {
					nt.slots = append(nt.slots, m)
					m.key = NewKey(sp.ID, uint32(len(nt.slots)-1))
				}
			} else {
				m = newMachine(sp.ID, sp.Policy, now, s.onEvent)
				nt.slots = append(nt.slots, m)
				m.key = NewKey(sp.ID, uint32(len(nt.slots)-1))
			}
			nt.byID[sp.ID] = m
		}
		keys[i] = m.key
	}
	var removed []ID
	for id := range old.byID {
		if _, ok := nt.byID[id]; !ok {
			removed = append(removed, id)
		}
	}
	s.tab.Store(nt)
	return keys, removed, nil
}

// get resolves a key: through its slot when it is a key this store handed
// out for that slot's breaker, by ID otherwise.
func (s *Memory) get(k Key) (*machine, error) {
	t := s.tab.Load()
	if slot := k.Slot(); slot != 0 && int(slot) < len(t.slots) {
		if m := t.slots[slot]; m != nil && m.key.Same(k) {
			return m, nil
		}
	}
	if m, ok := t.byID[k.ID()]; ok {
		return m, nil
	}
	return nil, ErrUnknown
}

// Peek implements Store.
func (s *Memory) Peek(_ context.Context, k Key, now int64) Verdict {
	m, err := s.get(k)
	if err != nil {
		return verdictHealthy
	}
	return m.peek(now)
}

// Acquire implements Store.
func (s *Memory) Acquire(_ context.Context, k Key, now int64, force bool) (Admission, bool, error) {
	m, err := s.get(k)
	if err != nil {
		return Admission{}, true, err
	}
	adm, ok := m.acquire(now, force)
	return adm, ok, nil
}

// Release implements Store.
func (s *Memory) Release(_ context.Context, k Key, adm Admission) error {
	if adm.Lease == 0 {
		return nil
	}
	m, err := s.get(k)
	if err != nil {
		return err
	}
	m.release(adm)
	return nil
}

// Record implements Store.
func (s *Memory) Record(_ context.Context, k Key, now int64, adm Admission, r Result) (Recorded, error) {
	m, err := s.get(k)
	if err != nil {
		return Recorded{}, err
	}
	var rec Recorded
	m.record(now, adm, &r, &rec)
	return rec, nil
}

// Stalled implements Store.
func (s *Memory) Stalled(_ context.Context, k Key, now int64) error {
	m, err := s.get(k)
	if err == nil {
		m.stalled(now)
	}
	return err
}

// ForceOpen implements Store.
func (s *Memory) ForceOpen(_ context.Context, k Key, now int64, d time.Duration) error {
	m, err := s.get(k)
	if err == nil {
		m.forceOpen(now, d)
	}
	return err
}

// ForceClose implements Store.
func (s *Memory) ForceClose(_ context.Context, k Key, now int64) error {
	m, err := s.get(k)
	if err == nil {
		m.forceClose(now)
	}
	return err
}

// Reset implements Store.
func (s *Memory) Reset(_ context.Context, k Key, now int64) error {
	m, err := s.get(k)
	if err == nil {
		m.reset(now)
	}
	return err
}

// Status implements Store.
func (s *Memory) Status(_ context.Context, k Key, now int64) (Status, error) {
	m, err := s.get(k)
	if err != nil {
		return Status{}, err
	}
	return m.status(now), nil
}

// Sweep implements Store.
func (s *Memory) Sweep(_ context.Context, now int64) error {
	for _, m := range s.tab.Load().slots {
		if m != nil {
			m.tick(now)
		}
	}
	s.notes.Sweep()
	return nil
}

// InProcess reports that every call of this store is answered in this
// process, at once: a caller may make one where it would not wait for a
// remote store (InProcessStore).
func (s *Memory) InProcess() bool { return true }

// NoteCount is how many notes the store keeps (live ones, and expired ones
// its sweep has not reclaimed yet).
func (s *Memory) NoteCount() int { return s.notes.Len() }

// SwapNote implements Store (notes.go).
func (s *Memory) SwapNote(_ context.Context, name string, prev, next []byte, ttl time.Duration) ([]byte, bool, error) {
	return s.notes.Swap(name, prev, next, ttl)
}
