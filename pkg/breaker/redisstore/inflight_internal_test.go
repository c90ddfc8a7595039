package redisstore

import (
	"strconv"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// A drained backlog holds nothing (#49, the fleet soak's memory check):
// answered outcomes leave no copy behind in the slots they vacate, and an
// empty backlog keeps no backing array from its burst. Before, answering
// 1,000 outcomes left a 1,000-slot array holding every one of them.
func TestADrainedBacklogHoldsNothing(t *testing.T) {
	var v view
	for i := 1; i <= 1000; i++ {
		v.fl.pending = append(v.fl.pending, ownOutcome{tok: uint64(i), res: breaker.Result{Key: "d" + strconv.Itoa(i) + ":1"}})
	}
	v.answeredUpTo(400)
	if len(v.fl.pending) != 600 {
		t.Fatalf("%d pending, want 600", len(v.fl.pending))
	}
	for _, o := range v.fl.pending[len(v.fl.pending):cap(v.fl.pending)] {
		if o.res.Key != "" {
			t.Fatalf("a vacated slot still holds an answered outcome (%s)", o.res.Key)
		}
	}
	v.answeredUpTo(1000)
	if cap(v.fl.pending) != 0 {
		t.Fatalf("an empty backlog keeps a %d-slot array", cap(v.fl.pending))
	}
	s := &Store{}
	e := &entry{}
	for i := range maxUnsent + 5 {
		s.owe(e, recJob{op: "rec", res: breaker.Result{Key: strconv.Itoa(i)}})
	}
	u := e.fl.unsent
	for _, j := range u[len(u):cap(u)] {
		if j.res.Key != "" {
			t.Fatalf("a dropped unsent call is still held (%s)", j.res.Key)
		}
	}
}

// A worker's overflow, once taken, keeps no job alive in its vacated
// slots (#49, the fleet soak's memory check).
func TestATakenOverflowHoldsNothing(t *testing.T) {
	s := &Store{over: make([]overflow, 1)}
	for i := range 300 {
		s.over[0].jobs = append(s.over[0].jobs, recJob{op: "rec", res: breaker.Result{Key: strconv.Itoa(i)}})
	}
	batch := s.takeOverflow(0, nil)
	if len(batch) != maxBatch {
		t.Fatalf("took %d, want %d", len(batch), maxBatch)
	}
	left := s.over[0].jobs
	for _, j := range left[len(left):cap(left)] {
		if j.res.Key != "" {
			t.Fatalf("a taken job is still held by the overflow (%s)", j.res.Key)
		}
	}
	s.takeOverflow(0, nil)
	if cap(s.over[0].jobs) != 0 {
		t.Fatalf("an empty overflow keeps a %d-slot array", cap(s.over[0].jobs))
	}
}
