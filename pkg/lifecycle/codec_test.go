package lifecycle

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
	parked := &Park{N: 2, Gateway: "default", Route: "openai:us:gpt-4o", Cluster: "openai_us", RouteGen: 7, RouteLease: 9, FleetGen: 3, Start: 1764600000000000000}
	for _, c := range []struct {
		name string
		n    Note
	}{
		{"parked", Note{Parked: parked}},
		{"parked, observed, done, a later attempt", Note{Parked: parked, Obs: true, Done: true, Later: 3}},
		{"observer first", Note{Obs: true}},
		{"a route key that needs escapes", Note{Parked: &Park{Route: "self:r:\"x\"\\é", Start: -1}}},
		{"an entry (encoding/json's)", Note{Entry: &EntryNote{Res: breaker.Result{Kind: breaker.KindStatus, Status: 503}, Cluster: "c", Attempt: 2}}},
		{"empty", Note{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := c.n.Encode()
			if c.n.empty() {
				if raw != nil {
					t.Fatalf("an empty note encodes as %q", raw)
				}
				return
			}
			var old, ours Note
			if err := json.Unmarshal(raw, &old); err != nil || !reflect.DeepEqual(old, c.n) {
				t.Fatalf("encoding/json reads %s as %+v (%v)", raw, old, err)
			}
			if err := Decode(raw, &ours); err != nil || !reflect.DeepEqual(ours, c.n) {
				t.Fatalf("decodeAttemptNote reads %s as %+v (%v)", raw, ours, err)
			}
			std, _ := json.Marshal(&c.n)
			ours = Note{}
			if err := Decode(std, &ours); err != nil || !reflect.DeepEqual(ours, c.n) {
				t.Fatalf("decodeAttemptNote reads encoding/json's %s as %+v (%v)", std, ours, err)
			}
		})
	}
}

// The common notes take the fast way, both ways.
func TestAttemptNoteFastPath(t *testing.T) {
	n := Note{Parked: &Park{N: 1, Gateway: "default", Route: "openai:us:gpt-4o", Cluster: "c", RouteGen: 4, Start: 5}, Obs: true}
	raw := n.Encode()
	var got Note
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
		var std, ours Note
		errStd := json.Unmarshal(b, &std)
		errOurs := Decode(b, &ours)
		if (errStd == nil) != (errOurs == nil) {
			t.Fatalf("%q: encoding/json %v, decodeAttemptNote %v", b, errStd, errOurs)
		}
		if errStd == nil && !reflect.DeepEqual(std, ours) {
			t.Fatalf("%q: encoding/json %+v, decodeAttemptNote %+v", b, std, ours)
		}
		note := Note{Parked: &Park{N: n, Gateway: gw, Route: route, RouteGen: gen, FleetLease: gen / 3, Start: start}, Obs: obs, Later: n}
		var back Note
		if err := json.Unmarshal(note.Encode(), &back); err != nil {
			t.Fatalf("%s does not decode: %v", note.Encode(), err)
		}
		// encoding/json replaces invalid UTF-8; compare what it keeps.
		want, _ := json.Marshal(&note)
		var viaStd Note
		_ = json.Unmarshal(want, &viaStd)
		if !reflect.DeepEqual(back, viaStd) {
			t.Fatalf("encoded %s, read back %+v, want %+v", note.Encode(), back, viaStd)
		}
	})
}
