package classify

import (
	"testing"
)

// slowChat is the general path alone: what chatChunkFast must agree with.
func slowChat(data []byte) tally {
	var t tally
	saved := fastEnabled
	fastEnabled = false
	t.openaiEventData(nil, data, 7)
	fastEnabled = saved
	return t
}

var chatSeeds = []string{
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1.5e2}}`,
	`{"choices":[{"delta":{"content":"   "}}]}`,
	`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":""}}]}}]}`,
	`{"choices":[{"delta":{"tool_calls":[]}}]}`,
	`{"choices":[{"delta":{"reasoning_content":"thinking"}}]}`,
	`{"choices":[{"delta":{"refusal":"no"}}]}`,
	`{"choices":[{"delta":{"content":"a\nb"}}]}`,
	`{"choices":[{"delta":{"content":"\u00a0"}}]}`,
	`{"choices":[{"delta":{"content":"x","content":"y"}}]}`,
	`{"choices":[{"delta":{"Content":"x"}}]}`,
	`{"choices":[{"text":"legacy"}],"object":"text_completion"}`,
	`{"choices":[{"delta":{"function_call":{"name":"f"}}}]}`,
	`{"error":{"message":"boom"}}`,
	`{"choices":[null]}`,
	`{"choices":[{"delta":"x"}]}`,
	`{"choices":[{"finish_reason":"length"},{"finish_reason":"stop"}]}`,
	`{"choices":[{"delta":{"content":"é"}}]} `,
	`{"choices":[{"delta":{"content":5}}]}`,
	`{"choices":[],"usage":{}}`,
	`{"choices":[{"index":0,"delta":{"content":"hi"}}]}x`,
}

// The fast path reads a chat chunk exactly as the general decoder does, or
// declines it.
func FuzzChatChunkFast(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast tally
		if !fast.chatChunkFast(data, 7) {
			return
		}
		if slow := slowChat(data); fast != slow {
			t.Fatalf("%q:\nfast %+v\nslow %+v", data, fast, slow)
		}
	})
}

func TestChatChunkFastSeeds(t *testing.T) {
	taken := 0
	for _, s := range chatSeeds {
		var fast tally
		if !fast.chatChunkFast([]byte(s), 7) {
			continue
		}
		taken++
		if slow := slowChat([]byte(s)); fast != slow {
			t.Errorf("%s:\nfast %+v\nslow %+v", s, fast, slow)
		}
	}
	if taken < 10 {
		t.Fatalf("the fast path took only %d of the common chunks", taken)
	}
}

func BenchmarkChatChunk(b *testing.B) {
	data := []byte(chatSeeds[0])
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = slowChat(data)
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t tally
			t.chatChunkFast(data, 7)
		}
	})
}
