package classify

import (
	"bytes"
	"testing"
)

func TestScanKeysIsContains(t *testing.T) {
	for _, s := range []string{
		``, `"`, `"error"`, `"usage"`, `"error`, `error"`, `{"usage":{},"error":1}`,
		`{"x":"error"}`, `""error"`, `"usage""error"`, `{"errors":1,"usages":2}`,
		`data {"choices":[{"delta":{"content":"tok"}}]}`, `"u"usage"`, `"e"`, `"usage`,
	} {
		e, u := scanKeys([]byte(s))
		if we, wu := bytes.Contains([]byte(s), []byte(`"error"`)), bytes.Contains([]byte(s), usageKey); e != we || u != wu {
			t.Errorf("scanKeys(%q) = %v, %v; want %v, %v", s, e, u, we, wu)
		}
	}
}

func FuzzScanKeys(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":1},"error":{}}`))
	f.Add([]byte(`""usage""`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, u := scanKeys(b)
		if we, wu := bytes.Contains(b, []byte(`"error"`)), bytes.Contains(b, usageKey); e != we || u != wu {
			t.Fatalf("scanKeys(%q) = %v, %v; want %v, %v", b, e, u, we, wu)
		}
	})
}

func BenchmarkScanKeys(b *testing.B) {
	data := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"token 7 "},"finish_reason":null}]}`)
	b.ReportAllocs()
	b.Run("scanKeys", func(b *testing.B) {
		for b.Loop() {
			scanKeys(data)
		}
	})
	b.Run("contains-twice", func(b *testing.B) {
		for b.Loop() {
			_ = bytes.Contains(data, []byte(`"error"`))
			_ = bytes.Contains(data, usageKey)
		}
	})
}
