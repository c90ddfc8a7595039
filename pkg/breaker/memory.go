package breaker

import (
	"context"
	"sync"
	"time"
)

// Memory is the in-process Store (R-ST1).
type Memory struct {
	mu      sync.RWMutex
	m       map[ID]*Breaker
	onEvent func(Event)
}

// NewMemory returns an empty memory store; onEvent (may be nil) receives
// every transition, outside any breaker lock.
func NewMemory(onEvent func(Event)) *Memory {
	return &Memory{m: map[ID]*Breaker{}, onEvent: onEvent}
}

// Breaker implements Store.
func (s *Memory) Breaker(id ID, p *Policy) *Breaker {
	s.mu.RLock()
	b, ok := s.m[id]
	s.mu.RUnlock()
	if ok {
		return b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok = s.m[id]; !ok {
		b = newBreaker(id, p, s.onEvent)
		s.m[id] = b
	}
	return b
}

// Lookup implements Store.
func (s *Memory) Lookup(id ID) (*Breaker, bool) {
	s.mu.RLock()
	b, ok := s.m[id]
	s.mu.RUnlock()
	return b, ok
}

// Acquire implements Store.
func (s *Memory) Acquire(b *Breaker, now int64, p *Policy, shadow, force bool) (Admission, bool) {
	return b.Acquire(now, p, shadow, force)
}

// Record implements Store.
func (s *Memory) Record(b *Breaker, now int64, p *Policy, adm Admission, r Result) Recorded {
	return b.Record(now, p, adm, r)
}

// ForceOpen implements Store.
func (s *Memory) ForceOpen(b *Breaker, now int64, p *Policy, d time.Duration) error {
	b.ForceOpen(now, p, d)
	return nil
}

// ForceClose implements Store.
func (s *Memory) ForceClose(b *Breaker, now int64, p *Policy) error {
	b.ForceClose(now, p)
	return nil
}

// Reset implements Store.
func (s *Memory) Reset(b *Breaker, now int64, p *Policy) error {
	b.Reset(now, p)
	return nil
}

// Each implements Store.
func (s *Memory) Each(fn func(*Breaker)) {
	s.mu.RLock()
	list := make([]*Breaker, 0, len(s.m))
	for _, b := range s.m {
		list = append(list, b)
	}
	s.mu.RUnlock()
	for _, b := range list {
		fn(b)
	}
}

// Sweep implements Store.
func (s *Memory) Sweep(now int64) {
	s.Each(func(b *Breaker) { b.Tick(now) })
}

// RunSweeper sweeps st every interval (≤ 1 s keeps R-S2) until ctx ends.
func RunSweeper(ctx context.Context, st Store, clock Clock, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			st.Sweep(clock.Now().UnixNano())
		}
	}
}
