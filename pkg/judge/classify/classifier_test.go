package classify

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

type fixture struct {
	file string
	api  string
	want Kind
}

var fixtures = []fixture{
	{"chat_stream_answer.sse", APIOpenAI, Answered},
	{"chat_stream_multichoice.sse", APIOpenAI, Answered},
	{"chat_stream_tool_calls.sse", APIOpenAI, Answered},
	{"chat_stream_dead_turn.sse", APIOpenAI, DeadTurn},
	{"chat_stream_length_empty.sse", APIOpenAI, LengthCap},
	{"chat_stream_reasoning_only.sse", APIOpenAI, ReasoningOnly},
	{"chat_stream_error_event.sse", APIOpenAI, StreamError},
	{"chat_stream_truncated.sse", APIOpenAI, Truncated},
	{"chat_stream_crlf.sse", APIOpenAI, Answered},
	{"chat_stream_cr.sse", APIOpenAI, Answered},
	{"chat_stream_garbage.sse", APIOpenAI, Unparseable},
	{"responses_stream_answer.sse", APIOpenAI, Answered},
	{"responses_stream_incomplete.sse", APIOpenAI, LengthCap},
	{"responses_stream_failed.sse", APIOpenAI, StreamError},
	{"responses_stream_error.sse", APIOpenAI, StreamError},
	{"responses_stream_function_call.sse", APIOpenAI, Answered},
	{"anthropic_stream_answer.sse", APIAnthropic, Answered},
	{"anthropic_stream_thinking_then_text.sse", APIAnthropic, Answered},
	{"anthropic_stream_thinking_only_max_tokens.sse", APIAnthropic, LengthCap},
	{"anthropic_stream_tool_use.sse", APIAnthropic, Answered},
	{"anthropic_stream_error.sse", APIAnthropic, StreamError},
	{"anthropic_stream_dead_turn.sse", APIAnthropic, DeadTurn},
	{"chat_completion.json", APIOpenAI, Answered},
	{"chat_completion_dead.json", APIOpenAI, DeadTurn},
	{"chat_completion_tool.json", APIOpenAI, Answered},
	{"responses.json", APIOpenAI, Answered},
	{"responses_incomplete.json", APIOpenAI, LengthCap},
	{"anthropic_message.json", APIAnthropic, Answered},
	{"anthropic_max_tokens_empty.json", APIAnthropic, LengthCap},
	{"anthropic_error.json", APIAnthropic, StreamError},
	{"embeddings.json", APIOpenAI, NotLLM},
	{"models_list.json", APIOpenAI, NotLLM},
	{"broken.json", APIOpenAI, Unparseable},
}

func contentType(file string) string {
	if strings.HasSuffix(file, ".sse") {
		return "text/event-stream; charset=utf-8"
	}
	return "application/json"
}

// run feeds body in the given chunk sizes; chunk i arrives at time i+1.
func run(api, ct string, body []byte, sizes func() int) Body {
	c := New(api, ct)
	now := int64(0)
	for len(body) > 0 {
		n := min(sizes(), len(body))
		now++
		c.Write(body[:n], now)
		body = body[n:]
	}
	return c.Finish(now + 1)
}

// Every fixture gives the same verdict whole, byte by byte and in random
// chunks (an event may be split at any byte, inside UTF-8 or a data: line).
func TestFixtures(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join("testdata", f.file))
			if err != nil {
				t.Fatal(err)
			}
			whole := run(f.api, contentType(f.file), body, func() int { return len(body) })
			if whole.Kind != f.want {
				t.Fatalf("whole: %v, want %v", whole.Kind, f.want)
			}
			bytewise := run(f.api, contentType(f.file), body, func() int { return 1 })
			if bytewise.Kind != f.want {
				t.Fatalf("1-byte chunks: %v, want %v", bytewise.Kind, f.want)
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(body))))
			for i := 0; i < 50; i++ {
				v := run(f.api, contentType(f.file), body, func() int { return 1 + rng.IntN(64) })
				if v.Kind != f.want {
					t.Fatalf("random chunks (round %d): %v, want %v", i, v.Kind, f.want)
				}
			}
			// Time to first visible token: with 1-byte chunks it is the
			// chunk that completed the first answering event.
			if f.want == Answered && strings.HasSuffix(f.file, ".sse") {
				if bytewise.FirstVisibleNs <= 0 || bytewise.FirstVisibleNs > int64(len(body)) {
					t.Fatalf("first visible at %d of %d", bytewise.FirstVisibleNs, len(body))
				}
			}
		})
	}
}

func TestFirstVisibleIsTheAnsweringEvent(t *testing.T) {
	body, _ := os.ReadFile("testdata/chat_stream_answer.sse")
	c := New(APIOpenAI, "text/event-stream")
	// Event by event, at times 1, 2, 3…: the first event has empty content,
	// the second says "Hello".
	for i, ev := range strings.SplitAfter(string(body), "\n\n") {
		c.Write([]byte(ev), int64(i+1))
	}
	if v := c.Finish(100); v.Kind != Answered || v.FirstVisibleNs != 2 {
		t.Fatalf("%+v", v)
	}
}

func TestWhitespaceIsNotVisible(t *testing.T) {
	for s, want := range map[string]bool{"": false, " \n\t": false, "\u00a0\u3000\u200b": false, "a": true, " é": true, "\u200bx": true, "。": true} {
		if visibleText(s) != want {
			t.Errorf("visibleText(%q) = %v", s, !want)
		}
	}
}

// Memory stays bounded whatever the provider sends.
func TestBoundedMemory(t *testing.T) {
	c := New(APIOpenAI, "text/event-stream")
	chunk := []byte(strings.Repeat("x", 64<<10))
	c.Write([]byte("data: "), 1)
	for i := 0; i < 64; i++ { // a 4 MiB line with no end
		c.Write(chunk, 1)
	}
	if cap(c.sse.line) > 2*MaxEventBytes { // append growth, but bounded
		t.Fatalf("line buffer grew to %d", cap(c.sse.line))
	}
	c.Write([]byte("\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"), 2)
	if v := c.Finish(3); v.Kind != Answered {
		t.Fatalf("after an oversize event: %v", v.Kind)
	}
	j := New(APIOpenAI, "application/json")
	for i := 0; i < 200; i++ {
		j.Write(chunk, 1)
	}
	if j.buf != nil || j.Finish(2).Kind != Unparseable {
		t.Fatal("oversize JSON must be dropped and unparseable")
	}
	if New(APIOpenAI, "audio/mpeg").Finish(1).Kind != NotLLM {
		t.Fatal("audio is not an LLM shape")
	}
}

func FuzzSSEOpenAI(f *testing.F)    { fuzzClassifier(f, APIOpenAI, "text/event-stream") }
func FuzzSSEAnthropic(f *testing.F) { fuzzClassifier(f, APIAnthropic, "text/event-stream") }
func FuzzJSON(f *testing.F)         { fuzzClassifier(f, APIOpenAI, "application/json") }
func FuzzJSONAnthropic(f *testing.F) {
	fuzzClassifier(f, APIAnthropic, "application/json")
}

// fuzzClassifier: any input, split anywhere, gives the same verdict as the
// input fed whole, and never panics.
func fuzzClassifier(f *testing.F, api, ct string) {
	for _, fx := range fixtures {
		if fx.api == api && contentType(fx.file)[:4] == ct[:4] {
			b, _ := os.ReadFile(filepath.Join("testdata", fx.file))
			f.Add(b, uint8(7))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, split uint8) {
		whole := run(api, ct, body, func() int { return len(body) + 1 })
		n := int(split%32) + 1
		parts := run(api, ct, body, func() int { return n })
		if whole.Kind != parts.Kind {
			t.Fatalf("whole %v, in %d-byte chunks %v", whole.Kind, n, parts.Kind)
		}
	})
}

func BenchmarkClassifySSE50Chunks(b *testing.B) {
	body, _ := os.ReadFile("testdata/chat_stream_answer.sse")
	events := strings.SplitAfter(string(body), "\n\n")
	var chunks [][]byte
	for i := 0; i < 49; i++ {
		chunks = append(chunks, []byte(events[1]))
	}
	chunks = append(chunks, []byte(events[3]+events[5]))
	b.ReportAllocs()
	for b.Loop() {
		c := New(APIOpenAI, "text/event-stream")
		for i, ch := range chunks {
			c.Write(ch, int64(i))
		}
		if c.Finish(99).Kind != Answered {
			b.Fatal("not answered")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/50, "ns/chunk")
}

// R-T5: with TrackGaps the classifier measures the longest gap between
// visible token deltas, in every provider's stream format.
func TestGapsBetweenTokens(t *testing.T) {
	cases := []struct {
		api, first, delta, end string
	}{
		{APIOpenAI, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n", "data: [DONE]\n\n"},
		{APIOpenAI, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n",
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n"},
		{APIAnthropic, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}\n\n",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	}
	for _, tc := range cases {
		c := NewForRoute(tc.api, "text/event-stream", false)
		c.TrackGaps = true
		ms := int64(1e6)
		c.Write([]byte(tc.first), 1000*ms)
		c.Write([]byte(tc.delta), 1200*ms)
		c.Write([]byte(tc.delta), 9200*ms) // 8 s of silence
		c.Write([]byte(tc.delta), 9300*ms)
		c.Write([]byte(tc.end), 20000*ms) // the end marker is not a token
		if c.LastProgress() != 9300*ms {
			t.Fatalf("%s: last progress %d", tc.api, c.LastProgress())
		}
		r := c.Result(breaker.Result{Kind: breaker.KindStatus, Status: 200}, 0, 20000*ms)
		if r.MaxGapMs != 8000 || r.Kind != breaker.KindAnswered {
			t.Fatalf("%s: max gap %d ms, kind %v", tc.api, r.MaxGapMs, r.Kind)
		}
	}
}

// Token usage is read where each API reports it: a chat completion's body,
// the last chunk of a chat stream, the Responses API's completed event and
// Anthropic's message_start and message_delta.
func TestUsage(t *testing.T) {
	cases := []struct {
		name, api, ct, body string
		in, out             int64
	}{
		{"chat body", "openai", "application/json", `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5}}`, 12, 5},
		{"chat stream", "openai", "text/event-stream", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n", 7, 3},
		{"responses", "openai", "text/event-stream", "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}\n\n", 9, 4},
		{"anthropic stream", "anthropic", "text/event-stream", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 20, 15},
		{"none", "openai", "application/json", `{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`, 0, 0},
	}
	for _, tc := range cases {
		c := New(tc.api, tc.ct)
		c.Write([]byte(tc.body), 1)
		c.Finish(2)
		if u := c.Usage(); u.InputTokens != tc.in || u.OutputTokens != tc.out {
			t.Errorf("%s: %+v, want %d in, %d out", tc.name, u, tc.in, tc.out)
		}
	}
}
