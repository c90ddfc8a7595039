package breaker

import "testing"

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
