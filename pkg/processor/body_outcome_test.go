package processor

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Body-level outcomes through the wire: each provider fixture is streamed to
// fusebox in random chunks after a 200, on a normal and a self-hosted route.
func TestBodyOutcomes(t *testing.T) {
	cases := []struct {
		fixture string
		model   string // gpt: openai route; llama: self-hosted openai route
		route   string
		class   string
		reason  string
	}{
		{"chat_stream_answer.sse", "gpt", "openai:us:gpt", "success", "success"},
		{"responses_stream_answer.sse", "gpt", "openai:us:gpt", "success", "success"},
		{"chat_completion.json", "gpt", "openai:us:gpt", "success", "success"},
		{"embeddings.json", "gpt", "openai:us:gpt", "success", "success"},
		{"chat_stream_dead_turn.sse", "gpt", "openai:us:gpt", "neither", "dead_turn"},
		{"chat_stream_dead_turn.sse", "llama", "self:a:llama", "failure", "dead_turn"},
		{"chat_completion_dead.json", "llama", "self:a:llama", "failure", "dead_turn"},
		{"chat_stream_length_empty.sse", "llama", "self:a:llama", "neither", "length_cap"},
		{"chat_stream_reasoning_only.sse", "llama", "self:a:llama", "neither", "reasoning_only"},
		{"responses_stream_incomplete.sse", "gpt", "openai:us:gpt", "neither", "length_cap"},
		{"chat_stream_error_event.sse", "gpt", "openai:us:gpt", "neither", "stream_error"},
		{"responses_stream_failed.sse", "gpt", "openai:us:gpt", "neither", "stream_error"},
		{"chat_stream_truncated.sse", "gpt", "openai:us:gpt", "neither", "stream_error"},
		{"chat_stream_garbage.sse", "gpt", "openai:us:gpt", "neither", "unparseable"},
		{"broken.json", "gpt", "openai:us:gpt", "neither", "unparseable"},
	}
	// Both profiles (#28): the route role judging the response, and the
	// observer judging it in observability mode, give the same outcome.
	// On fusebox's own transport, with the chunks paced as an upstream
	// streams them, the observer judges them inline on the connection's
	// reader (grpcwire.SetInline): the same outcomes.
	var inlined, inlineRuns atomic.Int64
	defer func() {
		if inlineRuns.Load() > 0 && inlined.Load() == 0 && !t.Failed() {
			t.Error("no chunk was judged inline")
		}
	}()
	for _, profile := range []string{"synchronous", "observer", "observer-inline"} {
		for _, tc := range cases {
			t.Run(profile+"/"+tc.fixture+"/"+tc.model, func(t *testing.T) {
				body, err := os.ReadFile(filepath.Join("..", "judge", "classify", "testdata", tc.fixture))
				if err != nil {
					t.Fatal(err)
				}
				ct := "application/json"
				if strings.HasSuffix(tc.fixture, ".sse") {
					ct = "text/event-stream"
				}
				rng := rand.New(rand.NewPCG(7, uint64(len(body))))
				var chunks []string
				for len(body) > 0 {
					n := min(1+rng.IntN(40), len(body))
					chunks = append(chunks, string(body[:n]))
					body = body[n:]
				}
				var e *env
				if strings.HasPrefix(profile, "observer") {
					e = newObserverEnv(t)
					if profile == "observer-inline" {
						e = newEnvOn(t, "envoy: {observer: true}\n"+testConfig, true)
						e.pace = time.Millisecond
						e.srv.inlineHook = func() { inlined.Add(1) }
						inlineRuns.Add(1)
					}
					c := e.open("")
					md := fuseboxMetadata(t, c.chat(tc.model))
					c.end()
					e.observeCT(md, "200", ct, chunks...)
				} else {
					e = newEnv(t)
					c := e.open("")
					c.chat(tc.model)
					c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", ct)
					for i, ch := range chunks {
						c.respBody(ch, i == len(chunks)-1)
					}
					c.end()
				}
				if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", tc.route, tc.class, tc.reason, breaker.OriginLabel(tc.class, tc.reason))); v != 1 {
					t.Fatalf("outcome{%s,%s} = %v", tc.class, tc.reason, v)
				}
			})
		}
	}
}

// R-O4 end to end: dead turns open a self-hosted route; a success then
// closes it through half-open (R-O6).
func TestDeadTurnsOpenSelfHostedRoute(t *testing.T) {
	dead, _ := os.ReadFile("../judge/classify/testdata/chat_stream_dead_turn.sse")
	answer, _ := os.ReadFile("../judge/classify/testdata/chat_stream_answer.sse")
	e := newEnv(t)
	send := func(body []byte) {
		c := e.open("")
		c.chat("llama")
		c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
		c.respBody(string(body), true)
		c.end()
	}
	send(dead)
	send(dead)
	if s := e.status("default", "self:a:llama"); s.State != "open" || s.Reason != "dead_turn" {
		t.Fatalf("%+v", s)
	}
	e.clk.Advance(10 * time.Second)
	send(answer)
	if s := e.status("default", "self:a:llama"); s.State != "closed" {
		t.Fatalf("a real answer must close the half-open route: %+v", s)
	}
}

// R-T4 through the wire: a stream is slow by its time to first visible
// token, measured on the injected clock.
func TestSlowFirstTokenOpens(t *testing.T) {
	e := newEnv(t)

	answer, _ := os.ReadFile("../judge/classify/testdata/chat_stream_answer.sse")
	events := strings.SplitAfter(string(answer), "\n\n")
	for i := 0; i < 2; i++ {
		c := e.open("")
		c.chat("slowm")
		c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "text/event-stream")
		c.respBody(events[0], false) // role only: not visible
		e.clk.Advance(3 * time.Second)
		c.respBody(events[1], false) // first visible token, 3 s in
		c.respBody(strings.Join(events[2:], ""), true)
		c.end()
	}
	if s := e.status("default", "openai:us:slow"); s.State != "open" || s.Reason != "slow_call_rate" {
		t.Fatalf("%+v", s)
	}
}
