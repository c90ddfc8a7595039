package judge

import (
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

func rawOf(kv ...string) HeadroomRaw {
	var r HeadroomRaw
	for i := 0; i+1 < len(kv); i += 2 {
		if slot := HeadroomHeader(kv[i]); slot >= 0 {
			r.Add(slot, kv[i+1])
		}
	}
	return r
}

// R-H1, R-H6: each provider's headers read; bad values left out and
// counted by why.
func TestHeadroomHeaders(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	cases := []struct {
		name string
		kv   []string
		want Headroom
		bad  string
	}{
		{"none", []string{"content-type", "application/json"}, Headroom{Requests: -1, Tokens: -1}, ""},
		{"openai", []string{"x-ratelimit-remaining-requests", "2", "x-ratelimit-reset-requests", "6m0s",
			"x-ratelimit-remaining-tokens", "1500", "x-ratelimit-reset-tokens", "20ms", "x-ratelimit-limit-requests", "60"},
			Headroom{Requests: 2, RequestsReset: at(6 * time.Minute), Tokens: 1500, TokensReset: at(20 * time.Millisecond)}, ""},
		{"anthropic: the smallest token budget counts", []string{"anthropic-ratelimit-requests-remaining", "3", "anthropic-ratelimit-requests-reset", "2026-12-01T12:00:30Z",
			"anthropic-ratelimit-tokens-remaining", "9000", "anthropic-ratelimit-tokens-reset", "2026-12-01T12:01:00Z",
			"anthropic-ratelimit-output-tokens-remaining", "400", "anthropic-ratelimit-output-tokens-reset", "2026-12-01T12:00:10Z"},
			Headroom{Requests: 3, RequestsReset: at(30 * time.Second), Tokens: 400, TokensReset: at(10 * time.Second)}, ""},
		{"a reset already past is now", []string{"anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", "2026-12-01T11:59:00Z"},
			Headroom{Requests: 0, RequestsReset: at(0), Tokens: -1}, ""},
		{"negative count", []string{"x-ratelimit-remaining-requests", "-4"}, Headroom{Requests: -1, Tokens: -1}, "map[negative:1]"},
		{"not a number", []string{"x-ratelimit-remaining-tokens", "lots"}, Headroom{Requests: -1, Tokens: -1}, "map[not_a_number:1]"},
		{"repeated", []string{"x-ratelimit-remaining-requests", "9", "x-ratelimit-remaining-requests", "0"}, Headroom{Requests: -1, Tokens: -1}, "map[repeated:1]"},
		{"a reset in days", []string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "3d"}, Headroom{Requests: 0, Tokens: -1}, "map[bad_reset:1]"},
		{"a reset beyond a day", []string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "48h0m0s"}, Headroom{Requests: 0, RequestsReset: at(24 * time.Hour), Tokens: -1}, "map[reset_too_far:1]"},
		{"a negative reset", []string{"x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "-1s"}, Headroom{Requests: 0, Tokens: -1}, "map[negative:1]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rawOf(c.kv...)
			got := r.Parse(now)
			bad := ""
			if got.Bad > 0 {
				bad = fmt.Sprint(got.BadReasons)
			}
			got.Bad, got.BadReasons = 0, nil
			if fmt.Sprint(got) != fmt.Sprint(c.want) || bad != c.bad {
				t.Fatalf("got %+v %s, want %+v %s", got, bad, c.want, c.bad)
			}
		})
	}
}

// The response headers' parse keeps the headroom headers, and a response
// without them allocates nothing more for it.
func TestResponseHeadersKeepHeadroom(t *testing.T) {
	hs := func(kv ...string) *extprocv3.HttpHeaders {
		m := &corev3.HeaderMap{}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return &extprocv3.HttpHeaders{Headers: m}
	}
	req := &extprocv3.ProcessingRequest{}
	p := ParseHeaders(hs(":status", "200", "x-ratelimit-remaining-requests", "1"), req)
	if h := p.Headroom.Parse(time.Now()); h.Requests != 1 {
		t.Fatalf("headroom %+v", h)
	}
	base := hs(":status", "200", "content-type", "text/event-stream")
	plain := hs(":status", "200", "content-type", "text/event-stream", "x-request-id", "abc", "openai-processing-ms", "12", "x-ratelimit-limit-requests", "60")
	want := testing.AllocsPerRun(100, func() { _ = ParseHeaders(base, req) })
	if n := testing.AllocsPerRun(100, func() { _ = ParseHeaders(plain, req) }); n != want {
		t.Fatalf("%v allocations for a response without headroom headers, %v for its status and type alone", n, want)
	}
}

func FuzzHeadroomHeaders(f *testing.F) {
	f.Add("x-ratelimit-remaining-requests", "2", "x-ratelimit-reset-requests", "6m0s")
	f.Add("anthropic-ratelimit-tokens-remaining", "10", "anthropic-ratelimit-tokens-reset", "2026-12-01T12:00:30Z")
	f.Add("x-ratelimit-reset-tokens", "9999999999h", "anthropic-ratelimit-requests-reset", "not a time")
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		r := rawOf(k1, v1, k2, v2)
		h := r.Parse(now)
		for _, at := range []int64{h.RequestsReset, h.TokensReset} {
			if at != 0 && (at < now.UnixNano() || at > now.Add(maxHeadroomReset).UnixNano()) {
				t.Fatalf("a reset outside now..now+1d: %v", time.Unix(0, at))
			}
		}
		if h.Requests < -1 || h.Tokens < -1 {
			t.Fatalf("a negative count trusted: %+v", h)
		}
	})
}

// firstRoute is the route of the one headroom series there is.
