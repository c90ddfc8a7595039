package breaker

import (
	"encoding/json"
	"testing"
)

// The journal keeps the last n transitions, newest first; a decision in the
// same gateway for a model the route serves becomes the entry's next
// request, once; a decision elsewhere does not; nothing waits once every
// entry has its next.
func TestJournal(t *testing.T) {
	j := NewJournal(3)
	if j.Waiting() {
		t.Fatal("an empty journal waits")
	}
	ev := func(gw, route string, at int64) Event {
		return Event{ID: RouteID(gw, route), From: Closed, To: Open, Reason: "provider_5xx", At: at, WindowCalls: 9, WindowFailures: 5}
	}
	for i, r := range []string{"a", "b", "c", "d"} {
		j.Add(ev("g", r, int64(i+1)*1e9))
	}
	got := j.Recent(10)
	if len(got) != 3 || got[0].Route != "d" || got[2].Route != "b" || got[0].Transition != "closed->open" || got[0].WindowFailures != 5 {
		t.Fatalf("recent %+v", got)
	}
	only := func(keys ...string) func(string) bool {
		return func(k string) bool {
			for _, x := range keys {
				if x == k {
					return true
				}
			}
			return false
		}
	}
	j.Decided("other", "m", "x", "routed", only("b", "c", "d"), 5e9) // another gateway
	j.Decided("g", "m", "e", "skipped", only("d", "e"), 6e9)
	got = j.Recent(3)
	if got[0].Next == nil || got[0].Next.Route != "e" || got[0].Next.Action != "skipped" || got[1].Next != nil || got[2].Next != nil {
		t.Fatalf("after one decision: %+v %+v %+v", got[0].Next, got[1].Next, got[2].Next)
	}
	j.Decided("g", "m2", "", "fail_fast", only("b", "c"), 7e9)
	if j.Waiting() {
		t.Fatal("still waiting after every entry had its next")
	}
	if got = j.Recent(3); got[0].Next.Route != "e" || got[1].Next.Action != "fail_fast" {
		t.Fatal("a later decision replaced an entry's next")
	}
}

// A fleet's journal and this replica's merge newest first, each entry
// once, this replica's own from its journal (which knows the next
// request), junk left out, at most n.
func TestMergeJournals(t *testing.T) {
	j := NewJournal(8)
	j.SetReplica("a")
	mine := j.Add(Event{ID: RouteID("g", "r1"), From: Closed, To: Open, At: 2e9})
	j.Decided("g", "m", "r2", "routed", func(string) bool { return true }, 3e9)
	other, _ := json.Marshal(JournalEntry{ID: "b:1", Replica: "b", At: 4, Gateway: "g", Route: "r2", Transition: "closed->open"})
	older, _ := json.Marshal(JournalEntry{ID: "b:0", Replica: "b", At: 1, Gateway: "g", Route: "r3", Transition: "closed->open"})
	mineInFleet, _ := json.Marshal(mine) // as the fleet holds it: no next
	got := MergeJournals(j.Recent(10), [][]byte{other, mineInFleet, []byte("junk"), older}, 10)
	if len(got) != 3 || got[0].ID != "b:1" || got[1].ID != "a:1" || got[2].ID != "b:0" {
		t.Fatalf("merged %+v", got)
	}
	if got[1].Next == nil || got[1].Next.Route != "r2" {
		t.Fatalf("this replica's entry lost its next request: %+v", got[1])
	}
	if got := MergeJournals(j.Recent(10), [][]byte{other, older}, 2); len(got) != 2 || got[1].ID != "a:1" {
		t.Fatalf("not bounded to n: %+v", got)
	}
}
