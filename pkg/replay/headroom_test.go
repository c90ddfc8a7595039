package replay

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// quotaLog is a minute of traffic all served live by route a, whose
// provider allows 10 requests and says so (OpenAI's headers; with
// anthropic, Anthropic's): requests 1..10 announce 9..0 left, 11..20 are
// 429s announcing 0, one a second.
func quotaLog(t *testing.T, anthropic bool) *Log {
	t.Helper()
	const start = 1764590400
	var b bytes.Buffer
	for i := 0; i < 20; i++ {
		code, outcome, reason := 200, "success", "success"
		left := 9 - i
		if i >= 10 {
			code, outcome, reason, left = 429, "neither", "rate_limited", 0
		}
		reset := fmt.Sprintf("%ds", 60-i)
		if anthropic {
			reset = "2025-12-01T12:01:00Z" // start + 60 s
		}
		fmt.Fprintf(&b, `{"start_time":"%d.000","duration_ms":12,"ttfb_ms":9,"code":%d,"flags":"-","details":"via_upstream","cluster":"ca","attempts":1,"gateway":"default","route":"a:r:m","ratelimit_requests":"%d","ratelimit_requests_reset":%q,"ratelimit_tokens":null,"ratelimit_tokens_reset":null,"fusebox":{"decision":"d%d","model":"m","outcome":%q,"reason":%q}}`+"\n",
			start+i, code, left, reset, i, outcome, reason)
	}
	dir := t.TempDir()
	path := dir + "/quota.log"
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := ReadFiles(path)
	if err != nil || len(log.Lines) != 20 || log.Malformed != 0 {
		t.Fatalf("%d lines, %d malformed, %v", len(log.Lines), log.Malformed, err)
	}
	return log
}

// R-H5: replay evaluates a candidate's headroom on the quota each logged
// response announced. With min_requests 3 the responses announcing 2, 1
// and 0 left saturate route a (its reset a minute on): the 2 successes
// after the first announcement of 2 and all ten 429s move to route b, and
// the report says so (moved, 429s avoided, per route). Without headroom
// nothing moves. OpenAI's duration resets and Anthropic's RFC 3339 ones
// alike.
func TestReplayEvaluatesHeadroom(t *testing.T) {
	for _, anthropic := range []bool{false, true} {
		for _, tc := range []struct {
			headroom           string
			moved, avoided429s int
		}{
			{"", 0, 0},
			{", headroom: {min_requests: 3}", 12, 10},
		} {
			t.Run(fmt.Sprintf("anthropic %v%s", anthropic, tc.headroom), func(t *testing.T) {
				// A Retry-After-free 429 is a neither by default: the
				// breaker alone never moves them.
				rt, err := routes.Parse([]byte(strings.Replace(cfg, "cooldown_ms: 30000}", "cooldown_ms: 30000"+tc.headroom+"}", 1)), routes.Options{})
				if err != nil {
					t.Fatal(err)
				}
				rep := Run(rt, quotaLog(t, anthropic))
				if rep.HeadroomMoved != tc.moved || rep.HeadroomAvoided429s != tc.avoided429s {
					t.Fatalf("moved %d, 429s avoided %d; want %d, %d", rep.HeadroomMoved, rep.HeadroomAvoided429s, tc.moved, tc.avoided429s)
				}
				for _, rr := range rep.Routes {
					if rr.Route == "a:r:m" && rr.Saturated != tc.moved {
						t.Fatalf("route a: %d passed over, want %d", rr.Saturated, tc.moved)
					}
				}
			})
		}
	}
}

// R-H7 in replay (#49), as live: request 0 is sent at 0 s and answers at
// 5 s announcing 59 left; request 1, sent at 1 s, announces 1 left and
// saturates route a. Request 0's answer was decided before the saturation
// began: it says nothing of the quota now, so request 2 at 6 s still moves
// to route b. Before, any later response ended the saturation.
func TestReplayOlderAnswerKeepsTheSaturation(t *testing.T) {
	const start = 1764590400
	var b bytes.Buffer
	for i, l := range []struct {
		at, dur int
		left    int
	}{{0, 5000, 59}, {1, 12, 1}, {6, 12, 58}} {
		fmt.Fprintf(&b, `{"start_time":"%d.000","duration_ms":%d,"ttfb_ms":9,"code":200,"flags":"-","details":"via_upstream","cluster":"ca","attempts":1,"gateway":"default","route":"a:r:m","ratelimit_requests":"%d","ratelimit_requests_reset":"50s","ratelimit_tokens":null,"ratelimit_tokens_reset":null,"fusebox":{"decision":"d%d","model":"m","outcome":"success","reason":"success"}}`+"\n",
			start+l.at, l.dur, l.left, i)
	}
	path := t.TempDir() + "/older.log"
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := ReadFiles(path)
	if err != nil || len(log.Lines) != 3 {
		t.Fatalf("%v", err)
	}
	rt, err := routes.Parse([]byte(strings.Replace(cfg, "cooldown_ms: 30000}", "cooldown_ms: 30000, headroom: {min_requests: 3}}", 1)), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep := Run(rt, log); rep.HeadroomMoved != 1 {
		t.Fatalf("moved %d, want 1 (request 2: the older answer must not end the saturation)", rep.HeadroomMoved)
	}
}
