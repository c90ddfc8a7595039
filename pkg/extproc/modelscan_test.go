package extproc

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestScanModel(t *testing.T) {
	cases := []struct {
		body  string
		model string
		found bool
		err   error
	}{
		{`{"model":"gpt-4o-mini","messages":[]}`, "gpt-4o-mini", true, nil},
		{` { "messages" : [ {"role":"user","content":"hi \"model\": x"} ] , "model" : "m1" } `, "m1", true, nil},
		{`{"model":"a","model":"b"}`, "", false, ErrModelTwice},
		{`{"model":"a","m\u006fdel":"b"}`, "", false, ErrModelTwice},
		{`{"x":{"model":"a"},"model":"b"}`, "b", true, nil},
		{`{"messages":[{"model":"inner"}]}`, "", false, nil},
		{`{"m\u006fdel":"esc"}`, "esc", true, nil},
		{`{"model":"caf\u00e9"}`, "café", true, nil},
		{`{}`, "", false, nil},
		{`{"model":5}`, "", false, ErrModelNotStr},
		{`{"model":null}`, "", false, errModelNull},
		{`{"model":"x"`, "", false, errBadJSON},
		{`{"model":"x",}`, "", false, errBadJSON},
		{`{"model":"x"} extra`, "", false, errBadJSON},
		{`[1,2]`, "", false, errNotObject},
		{`"str"`, "", false, errNotObject},
		{``, "", false, errBadJSON},
		{`{"a":01}`, "", false, errBadJSON},
		{`{"a":1.}`, "", false, errBadJSON},
		{`{"a":-1.5e+3,"b":[true,false,null],"model":"ok"}`, "ok", true, nil},
		{"{\"a\":\"\x01\"}", "", false, errBadJSON},
		{"{\"a\":\"\xff\",\"model\":\"m\"}", "m", true, nil},
		{`{"a":"\x"}`, "", false, errBadJSON},
		{`{"a":tru}`, "", false, errBadJSON},
		{strings.Repeat("[", 600) + strings.Repeat("]", 600), "", false, errTooDeep},
		{strings.Repeat("[", 60) + strings.Repeat("]", 60), "", false, errNotObject},
		{`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`, "", false, errTooDeep},
	}
	for _, tc := range cases {
		m, err := ScanModel([]byte(tc.body))
		if err != tc.err || m.Name != tc.model || m.Found != tc.found {
			t.Errorf("%.60q: got %q found=%v err=%v; want %q %v %v", tc.body, m.Name, m.Found, err, tc.model, tc.found, tc.err)
		}
	}
}

func TestRewriteModel(t *testing.T) {
	body := []byte(`{"stream":true, "model" : "gpt-4o-mini", "messages":[{"content":"model"}]}`)
	m, err := ScanModel(body)
	if err != nil {
		t.Fatal(err)
	}
	out := RewriteModel(body, m, "my-deployment")
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	if v["model"] != "my-deployment" || v["stream"] != true {
		t.Fatalf("%s", out)
	}
	if !bytes.Contains(out, []byte(`"content":"model"`)) {
		t.Fatal("rewrote the wrong place")
	}
}

// scanModel agrees with encoding/json on validity and on the model.
func FuzzScanModel(f *testing.F) {
	for _, s := range []string{`{"model":"x"}`, `{"a":[1,{"b":null}],"model":"y"}`, `{"model":1}`, `[]`, `{"m\u006fdel":"z"}`, `{"model":"a","model":"b"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ScanModel(b)
		valid := json.Valid(b)
		if err == errTooDeep {
			return
		}
		if (err == nil || err == ErrModelNotStr || err == errNotObject || err == errModelNull || err == ErrModelTwice) != valid {
			t.Fatalf("scanModel err=%v but json.Valid=%v for %q", err, valid, b)
		}
		if err != nil {
			return
		}
		var v map[string]json.RawMessage
		if json.Unmarshal(b, &v) != nil {
			t.Fatalf("accepted non-object %q", b)
		}
		raw, ok := v["model"]
		if ok != m.Found {
			// encoding/json matches keys case-insensitively only for
			// structs; a map keeps exact keys, so they must agree.
			t.Fatalf("found=%v, json says %v for %q", m.Found, ok, b)
		}
		if ok {
			var name string
			if json.Unmarshal(raw, &name) != nil || name != m.Name {
				t.Fatalf("model %q, json says %s", m.Name, raw)
			}
			out := RewriteModel(b, m, "rewritten")
			var v2 map[string]any
			if json.Unmarshal(out, &v2) != nil || v2["model"] != "rewritten" {
				t.Fatalf("rewrite broke %q → %q", b, out)
			}
		}
	})
}

func BenchmarkScanModel1MiB(b *testing.B) {
	body := bigChatBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ScanModel(body); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(body)/1024), "ns/KiB")
}

// Baseline in the same run: decoding the whole document with encoding/json.
func BenchmarkJSONUnmarshal1MiB(b *testing.B) {
	body := bigChatBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var v struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(body)/1024), "ns/KiB")
}

// bigChatBody is a 1 MiB chat request with the model at the end.
func bigChatBody() []byte {
	var sb strings.Builder
	sb.WriteString(`{"messages":[`)
	for sb.Len() < 1<<20 {
		sb.WriteString(`{"role":"user","content":"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor \"incididunt\" ut labore"},`)
	}
	sb.WriteString(`{"role":"user","content":"end"}],"model":"gpt-4o-mini","stream":true}`)
	return []byte(sb.String())
}

// plain8 agrees with a byte-by-byte check on every byte value in every lane.
func TestPlain8(t *testing.T) {
	for lane := 0; lane < 8; lane++ {
		for c := 0; c < 256; c++ {
			var b [8]byte
			for i := range b {
				b[i] = 'a'
			}
			b[lane] = byte(c)
			want := c != '"' && c != '\\' && c >= 0x20
			if got := plain8(binary.LittleEndian.Uint64(b[:])); got != want {
				t.Fatalf("lane %d byte %#x: plain8 %v, want %v", lane, c, got, want)
			}
		}
	}
}

// special8's lowest mark is the first byte that ends or escapes a string,
// whatever the bytes above it (a borrow marks bytes above a true one): two
// special bytes in every pair of lanes, and random words.
func TestSpecial8FirstMark(t *testing.T) {
	first := func(b [8]byte) int {
		for i, c := range b {
			if c == '"' || c == '\\' || c < 0x20 {
				return i
			}
		}
		return 8
	}
	check := func(b [8]byte) {
		t.Helper()
		m := special8(binary.LittleEndian.Uint64(b[:]))
		got := 8
		if m != 0 {
			got = bits.TrailingZeros64(m) / 8
		}
		if want := first(b); got != want {
			t.Fatalf("% x: first special byte at %d, special8 says %d", b[:], want, got)
		}
	}
	specials := []byte{0, 0x01, 0x1f, '"', '\\'}
	others := []byte{'a', 0x20, 0x21, 0x5b, 0x5d, 0x7f, 0x80, 0xa0, 0xff}
	for lo := 0; lo < 8; lo++ {
		for hi := lo; hi < 8; hi++ {
			for _, s := range specials {
				for _, o := range append(others, specials...) {
					var b [8]byte
					for i := range b {
						b[i] = 0xa1
					}
					b[lo], b[hi] = s, o
					check(b)
					b[lo], b[hi] = o, s
					check(b)
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], r.Uint64())
		check(b)
	}
}
