package redisstore

import "testing"

// TestSyncMachine enumerates every phase and event: the store's way back
// to Redis goes only through syncTable's edges (degraded, writing back,
// reading, synced), a failed call sends it back to degraded from any
// phase, and an event that means nothing in a phase changes nothing.
func TestSyncMachine(t *testing.T) {
	want := map[[2]int]syncPhase{
		{int(synced), int(callFailed)}:       degraded,
		{int(degraded), int(callFailed)}:     degraded,
		{int(degraded), int(reachable)}:      writingBack,
		{int(writingBack), int(callFailed)}:  degraded,
		{int(writingBack), int(writtenBack)}: reading,
		{int(reading), int(callFailed)}:      degraded,
		{int(reading), int(readBack)}:        synced,
	}
	for p := synced; p <= reading; p++ {
		for ev := callFailed; ev <= readBack; ev++ {
			var s syncState
			s.p.Store(int32(p))
			from, moved := s.step(ev)
			got := s.phase()
			to, listed := want[[2]int{int(p), int(ev)}]
			if !listed {
				to = p
			}
			if from != p || got != to || moved != (to != p) {
				t.Errorf("%v on %v: %v (moved %v), want %v", ev, p, got, moved, to)
			}
		}
	}
	// The local view is the store while degraded or writing back, and
	// only then.
	for p, local := range map[syncPhase]bool{synced: false, degraded: true, writingBack: true, reading: false} {
		var s syncState
		s.p.Store(int32(p))
		if s.localIsTheStore() != local {
			t.Errorf("%v: local view the store = %v", p, !local)
		}
	}
}
