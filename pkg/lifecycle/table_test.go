package lifecycle

import (
	"encoding/json"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The note's state machine, every order of park, arrival, entry and
// expiry (table-driven).
func TestStep(t *testing.T) {
	p1 := &Park{N: 1, Gateway: "g", Route: "r1", Cluster: "c1"}
	p2 := &Park{N: 2, Gateway: "g", Route: "r2", Cluster: "c2"}
	uf := Entry{Res: breaker.Result{Kind: breaker.KindConnError}, Cluster: "c2", Attempt: 2}
	cases := []struct {
		name string
		cur  Note
		op   Op
		how  How
		next Note
	}{
		{"park on nothing", Note{}, Op{Park: p1}, HowParked, Note{Parked: p1, Later: 1}},
		{"park after a later arrival", Note{Later: 2}, Op{Park: p1}, HowConnErr, Note{Later: 2, Rec: 1 << 1}},
		{"park after the same attempt's arrival", Note{Later: 1}, Op{Park: p1}, HowParked, Note{Parked: p1, Later: 1}},
		{"arrival claims an earlier park", Note{Parked: p1}, Op{Arrive: 2}, HowConnErr, Note{Later: 2, Rec: 1 << 1, Arr: 1 << 2}},
		{"an attempt arriving twice (a replayed token)", Note{Later: 2, Arr: 1 << 2}, Op{Arrive: 2}, HowDuplicate, Note{Later: 2, Arr: 1 << 2}},
		{"arrival of the parked attempt itself", Note{Parked: p2}, Op{Arrive: 2}, HowNone, Note{Parked: p2, Later: 2, Arr: 1 << 2}},
		{"entry claims its park", Note{Parked: p2}, Op{Entry: &uf}, HowEntry, Note{Rec: 1 << 2}},
		{"entry for a later attempt claims the parked one", Note{Parked: p1}, Op{Entry: &uf}, HowConnErr, Note{Later: 2, Entry: &EntryNote{Res: uf.Res, Cluster: "c2", Attempt: 2}, Rec: 1 << 1}},
		{"entry for another cluster", Note{Parked: p1}, Op{Entry: &Entry{Res: uf.Res, Cluster: "c9", Attempt: 1}}, HowMismatch, Note{Parked: p1}},
		{"entry for another attempt", Note{Parked: p2}, Op{Entry: &Entry{Res: uf.Res, Cluster: "c2", Attempt: 1}}, HowMismatch, Note{Parked: p2}},
		{"an entry naming its cluster is not a no-host entry", Note{Parked: p1}, Op{Entry: &Entry{Res: uf.Res, Cluster: "c2", Attempt: 2}},
			HowConnErr, Note{Later: 2, Entry: &EntryNote{Res: uf.Res, Cluster: "c2", Attempt: 2}, Rec: 1 << 1}},
		{"entry first waits", Note{}, Op{Entry: &uf}, HowEarly, Note{Later: 2, Entry: &EntryNote{Res: uf.Res, Cluster: "c2", Attempt: 2}}},
		{"park takes an early entry", Note{Entry: &EntryNote{Res: uf.Res, Cluster: "c2", Attempt: 2}}, Op{Park: p2}, HowEntry, Note{Later: 2, Rec: 1 << 2}},
		{"expiry of its own park", Note{Parked: p1}, Op{Park: p1, Expire: true}, HowNeither, Note{Parked: p1, Expired: true}},
		{"expiry after a claim", Note{}, Op{Park: p1, Expire: true}, HowNone, Note{}},
		{"expiry after a newer park", Note{Parked: p2}, Op{Park: p1, Expire: true}, HowNone, Note{Parked: p2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			next, act := Step(tc.cur, tc.op)
			if act.How != tc.how || string(next.Encode()) != string(tc.next.Encode()) {
				t.Fatalf("got %v %s, want %v %s", act.How, next.Encode(), tc.how, tc.next.Encode())
			}
		})
	}
}

// The decision's note settles who records a route-role decision in the
// observer deployment, in every order of its three arrivals: the route
// role's park (its stream ended with no response), the observer, and an
// access log entry. Exactly one of them records (the one marked *).
func TestObserveStep(t *testing.T) {
	park := func() Op {
		return Op{Park: &Park{Gateway: "g", Route: "r", Cluster: "c"}}
	}
	entry := func() Op { return Op{Entry: &Entry{Cluster: "c"}} }
	observe := Op{Observe: true}
	records := map[How]bool{HowEntry: true, HowObserved: true, HowObserveFirst: true}
	cases := []struct {
		name string
		ops  []Op
		who  int // the op that records
	}{
		{"park, observer, entry", []Op{park(), observe, entry()}, 1},
		{"observer, park, entry", []Op{observe, park(), entry()}, 0},
		{"park, entry, observer", []Op{park(), entry(), observe}, 1},
		{"entry, park, observer", []Op{entry(), park(), observe}, 1},
		{"observer, entry, park", []Op{observe, entry(), park()}, 0},
		{"entry, observer, park", []Op{entry(), observe, park()}, 1},
	}
	for _, c := range cases {
		var n Note
		for i, op := range c.ops {
			var raw []byte
			if i > 0 {
				raw = n.Encode() // each step goes through the store
			}
			n = Note{}
			if raw != nil {
				if err := json.Unmarshal(raw, &n); err != nil {
					t.Fatal(err)
				}
			}
			next, act := Step(n, op)
			if records[act.How] != (i == c.who) {
				t.Fatalf("%s: op %d did %d; want only op %d to record", c.name, i, act.How, c.who)
			}
			n = next
		}
	}
}
