package redisstore

import "sync/atomic"

// The store's way back to Redis after an outage, as a state machine of its
// own (R-ST4, R-ST14). Every phase, and what moves the store from one to
// the next, is in syncTable; nothing else sets the phase. A call that fails
// makes the store degraded from any phase; Refresh (refresh.go) walks it
// back: reachable, written back, read back.
//
//	synced ──callFailed──▶ degraded ──reachable──▶ writingBack
//	   ▲                      ▲  ◀──callFailed──────────┘  │ writtenBack
//	   │                      └──────callFailed──┐         ▼
//	   └──────────────readBack─────────────────── reading ◀┘
type syncPhase int32

const (
	// synced: Redis answers; the scripts are the store, and a refresh
	// reads what changed.
	synced syncPhase = iota
	// degraded: Redis does not answer; the local view is the store
	// (decisions and records stay on this replica).
	degraded
	// writingBack: Redis answers again; what the local view learned
	// (owed outcomes and releases, opens, overrides) goes back first. The
	// local view is still the store.
	writingBack
	// reading: written back; every breaker is read back from Redis, and
	// the scripts are the store again.
	reading
)

var phaseNames = [...]string{"synced", "degraded", "writing_back", "reading"}

func (p syncPhase) String() string { return phaseNames[p] }

// syncEvent is what moves the phase.
type syncEvent int

const (
	callFailed  syncEvent = iota // a call to Redis failed (not a key's own error)
	reachable                    // Redis answered the resync's first call
	writtenBack                  // every breaker's owed calls are in Redis
	readBack                     // every breaker is read back from Redis
)

var syncEventNames = [...]string{"call_failed", "reachable", "written_back", "read_back"}

func (e syncEvent) String() string { return syncEventNames[e] }

// syncTable is the whole machine: the phase an event leads to from each
// phase; a pair not listed changes nothing.
var syncTable = map[syncPhase]map[syncEvent]syncPhase{
	synced:      {callFailed: degraded},
	degraded:    {callFailed: degraded, reachable: writingBack},
	writingBack: {callFailed: degraded, writtenBack: reading},
	reading:     {callFailed: degraded, readBack: synced},
}

// syncState is the store's phase.
type syncState struct{ p atomic.Int32 }

func (s *syncState) phase() syncPhase { return syncPhase(s.p.Load()) }

// step takes ev: it reports the phase it left and whether ev moved it
// (false: ev means nothing in the current phase).
func (s *syncState) step(ev syncEvent) (from syncPhase, moved bool) {
	for {
		cur := syncPhase(s.p.Load())
		next, ok := syncTable[cur][ev]
		if !ok {
			return cur, false
		}
		if s.p.CompareAndSwap(int32(cur), int32(next)) {
			return cur, next != cur
		}
	}
}

// localIsTheStore: Redis is not the store now (degraded, or writing back).
func (s *syncState) localIsTheStore() bool {
	p := s.phase()
	return p == degraded || p == writingBack
}
