package replay

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// The fast reader answers what encoding/json answers, or steps aside.
func FuzzFastLineIsEncodingJSON(f *testing.F) {
	for _, l := range bytes.Split(synthetic(3, 1), []byte("\n")) {
		f.Add(l)
	}
	for _, s := range []string{
		`{"start_time":"1","start_time":null,"flags":"x","flags":null}`,
		`{"Start_Time":"1"}`, `{"flags":1}`, `{"code":"5\u00303"}`, `{"fusebox":{"tokens_in":1e400}}`,
		`{"fusebox":{"model":"m","model":null,"tokens_in":-0.5e+2}}`, `{"a":[1]}`, `{"a":{"b":{}}}`,
		`{"ratelimit_requests":"12","ratelimit_tokens":7}`, `{}`, `{"a":1,}`, `{"a":01}`, `{"a":1.}`, `{"a":tru}`,
		`{"fusebox":{"route":"a:r:m","gateway":"g"}} `, `{"fusebox":{"replica":"p-1","fp":"00aa","again":true}}`,
		`{"fusebox":{"again":"true"}}`, `{"fusebox":{"again":null,"fp":1}}`, `{"fusebox":"-"}`, "{\"x\":\"\x80\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, gotFb, ok := fastLine(b); ok {
			var want rawLine
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("fast read %q, encoding/json refuses it: %v", b, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q:\nfast %+v\njson %+v", b, got, want)
			}
			// The metadata object read in the same pass is what
			// encoding/json reads from the line's last one.
			if len(want.Fusebox) > 0 && want.Fusebox[0] == '{' {
				var wantFb rawFusebox
				if err := json.Unmarshal(want.Fusebox, &wantFb); err != nil || gotFb != wantFb {
					t.Fatalf("%q: fast fusebox %+v, json %+v (%v)", b, gotFb, wantFb, err)
				}
			}
		}
		if got, ok := fastFusebox(b); ok {
			var want rawFusebox
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("fast read %q, encoding/json refuses it: %v", b, err)
			}
			if got != want {
				t.Fatalf("%q:\nfast %+v\njson %+v", b, got, want)
			}
		}
	})
}

// The lines fusebox's shipped formats write take the fast path (else the
// speed is lost without a failing test).
func TestShippedLinesAreReadFast(t *testing.T) {
	lines := [][]byte{
		[]byte(`{"start_time":"2026-12-01T10:00:00.000Z","duration_ms":12,"ttfb_ms":"-","code":200,"flags":"-","details":"via_upstream","cluster":"openai","attempts":1,"gateway":"default","route":"openai:us:gpt","fusebox":{"decision":"d1","model":"gpt","action":"primary","outcome":"success","reason":"success","tokens_in":12,"tokens_out":40,"replica":"pod-a-1f2e","fp":"2ea8e09e378feedd","again":true},"ratelimit_requests":"99","ratelimit_requests_reset":"1s","ratelimit_tokens":null,"ratelimit_tokens_reset":null}`),
		[]byte(`{"start_time":1764590400.5,"code":"503","fusebox":"-","route":null}`),
	}
	lines = append(lines, bytes.Split(bytes.TrimSpace(synthetic(2, 1)), []byte("\n"))...)
	for _, l := range lines {
		if _, _, ok := fastLine(l); !ok {
			t.Fatalf("not read fast: %s", l)
		}
	}
}
