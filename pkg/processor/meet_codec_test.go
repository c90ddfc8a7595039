package processor

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The notes fusebox writes, read back by encoding/json (an older replica)
// and by decodeAttemptNote; and notes encoding/json writes, read by
// decodeAttemptNote.
func TestAttemptNoteJSON(t *testing.T) {
	parked := &parkedNote{N: 2, Gateway: "default", Route: "openai:us:gpt-4o", Cluster: "openai_us", RouteGen: 7, RouteLease: 9, FleetGen: 3, Start: 1764600000000000000}
	for _, c := range []struct {
		name string
		n    attemptNote
	}{
		{"parked", attemptNote{Parked: parked}},
		{"parked, observed, done, a later attempt", attemptNote{Parked: parked, Obs: true, Done: true, Later: 3}},
		{"observer first", attemptNote{Obs: true}},
		{"a route key that needs escapes", attemptNote{Parked: &parkedNote{Route: "self:r:\"x\"\\é", Start: -1}}},
		{"an entry (encoding/json's)", attemptNote{Entry: &entryNote{Res: breaker.Result{Kind: breaker.KindStatus, Status: 503}, Cluster: "c", Attempt: 2}}},
		{"empty", attemptNote{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := c.n.encode()
			if c.n.empty() {
				if raw != nil {
					t.Fatalf("an empty note encodes as %q", raw)
				}
				return
			}
			var old, ours attemptNote
			if err := json.Unmarshal(raw, &old); err != nil || !reflect.DeepEqual(old, c.n) {
				t.Fatalf("encoding/json reads %s as %+v (%v)", raw, old, err)
			}
			if err := decodeAttemptNote(raw, &ours); err != nil || !reflect.DeepEqual(ours, c.n) {
				t.Fatalf("decodeAttemptNote reads %s as %+v (%v)", raw, ours, err)
			}
			std, _ := json.Marshal(&c.n)
			ours = attemptNote{}
			if err := decodeAttemptNote(std, &ours); err != nil || !reflect.DeepEqual(ours, c.n) {
				t.Fatalf("decodeAttemptNote reads encoding/json's %s as %+v (%v)", std, ours, err)
			}
		})
	}
}

// The common notes take the fast way, both ways.
func TestAttemptNoteFastPath(t *testing.T) {
	n := attemptNote{Parked: &parkedNote{N: 1, Gateway: "default", Route: "openai:us:gpt-4o", Cluster: "c", RouteGen: 4, Start: 5}, Obs: true}
	raw := n.encode()
	var got attemptNote
	if !readAttemptNote(raw, &got) {
		t.Fatalf("%s not read by the fast reader", raw)
	}
	if std, _ := json.Marshal(&n); string(std) != string(raw) {
		t.Fatalf("encoded %s, encoding/json %s", raw, std)
	}
}

// FuzzAttemptNoteJSON: for any input, decodeAttemptNote agrees with
// encoding/json (the value and whether it fails); for any note, what
// encode writes encoding/json reads back as the same note.
func FuzzAttemptNoteJSON(f *testing.F) {
	f.Add([]byte(`{"p":{"n":1,"g":"default","r":"a:b:c","c":"x","rg":2,"rl":3,"s":4},"l":2,"o":true,"x":true}`), "default", "a:b:c", 1, uint64(2), int64(4), true)
	f.Add([]byte(`{"p":{"n":01}}`), "g", "r\"", -1, uint64(0), int64(-5), false)
	f.Add([]byte(`{"p":{"n":1},"p":{"g":"y"}}`), "", "", 0, uint64(1<<63), int64(0), false)
	f.Fuzz(func(t *testing.T, b []byte, gw, route string, n int, gen uint64, start int64, obs bool) {
		var std, ours attemptNote
		errStd := json.Unmarshal(b, &std)
		errOurs := decodeAttemptNote(b, &ours)
		if (errStd == nil) != (errOurs == nil) {
			t.Fatalf("%q: encoding/json %v, decodeAttemptNote %v", b, errStd, errOurs)
		}
		if errStd == nil && !reflect.DeepEqual(std, ours) {
			t.Fatalf("%q: encoding/json %+v, decodeAttemptNote %+v", b, std, ours)
		}
		note := attemptNote{Parked: &parkedNote{N: n, Gateway: gw, Route: route, RouteGen: gen, FleetLease: gen / 3, Start: start}, Obs: obs, Later: n}
		var back attemptNote
		if err := json.Unmarshal(note.encode(), &back); err != nil {
			t.Fatalf("%s does not decode: %v", note.encode(), err)
		}
		// encoding/json replaces invalid UTF-8; compare what it keeps.
		want, _ := json.Marshal(&note)
		var viaStd attemptNote
		_ = json.Unmarshal(want, &viaStd)
		if !reflect.DeepEqual(back, viaStd) {
			t.Fatalf("encoded %s, read back %+v, want %+v", note.encode(), back, viaStd)
		}
	})
}
