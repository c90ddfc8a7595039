package judge

import (
	"strconv"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Rate-limit headroom (SPEC §15, R-H1): what a provider announces of its
// quota on every response. OpenAI, Azure OpenAI, Groq, OpenRouter and
// other OpenAI-compatible servers send x-ratelimit-remaining-requests and
// -tokens with x-ratelimit-reset-requests and -tokens (Go-style durations:
// "1s", "6m0s", "20ms"); Anthropic sends
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining
// and -reset (RFC 3339).

// HeadroomRaw holds the header values of one response, as they came (the
// parse of the response headers only keeps them: a response without them
// costs nothing more).
type HeadroomRaw struct {
	vals [hrKinds]string
	// seen marks each header found; a header found twice is not trusted.
	seen, repeated uint16
}

const (
	hrOpenAIRequests = iota
	hrOpenAITokens
	hrOpenAIResetRequests
	hrOpenAIResetTokens
	hrAnthRequests
	hrAnthTokens
	hrAnthInputTokens
	hrAnthOutputTokens
	hrAnthResetRequests
	hrAnthResetTokens
	hrAnthResetInputTokens
	hrAnthResetOutputTokens
	hrKinds
)

// HeadroomHeader maps a response header name to its slot, -1 for any
// other header.
func HeadroomHeader(name string) int {
	switch {
	case strings.HasPrefix(name, "x-ratelimit-"):
		switch name[len("x-ratelimit-"):] {
		case "remaining-requests":
			return hrOpenAIRequests
		case "remaining-tokens":
			return hrOpenAITokens
		case "reset-requests":
			return hrOpenAIResetRequests
		case "reset-tokens":
			return hrOpenAIResetTokens
		}
	case strings.HasPrefix(name, "anthropic-ratelimit-"):
		switch name[len("anthropic-ratelimit-"):] {
		case "requests-remaining":
			return hrAnthRequests
		case "tokens-remaining":
			return hrAnthTokens
		case "input-tokens-remaining":
			return hrAnthInputTokens
		case "output-tokens-remaining":
			return hrAnthOutputTokens
		case "requests-reset":
			return hrAnthResetRequests
		case "tokens-reset":
			return hrAnthResetTokens
		case "input-tokens-reset":
			return hrAnthResetInputTokens
		case "output-tokens-reset":
			return hrAnthResetOutputTokens
		}
	}
	return -1
}

// Add keeps one header's value (slot from HeadroomHeader).
func (r *HeadroomRaw) Add(slot int, v string) {
	bit := uint16(1) << slot
	if r.seen&bit != 0 {
		r.repeated |= bit
	}
	r.seen |= bit
	r.vals[slot] = v
}

// Headroom is what a response announced: the remaining requests and
// tokens (-1: not announced) and when each resets (unix ns; 0: not
// announced), and how many of its values were not trusted.
type Headroom struct {
	Requests, Tokens           int64
	RequestsReset, TokensReset int64
	Bad                        int
	// BadReasons counts the untrusted values by why (R-H6).
	BadReasons map[string]int
}

// Announced reports whether anything was announced.
func (h Headroom) Announced() bool { return h.Requests >= 0 || h.Tokens >= 0 }

// maxHeadroomReset bounds a reset a header can announce before the
// policy's cap (max_retry_after_sec) applies: a reset counted in days is
// not a per-minute quota's, and is not trusted (R-H6).
const maxHeadroomReset = 24 * time.Hour

// Parse reads the values kept: a remaining count must be a whole number
// ≥0, a reset a duration (OpenAI) or an RFC 3339 time (Anthropic) within a
// day; anything else, or a header given twice, is left out and counted.
// Of Anthropic's token budgets the smallest remaining one counts, with its
// reset.
func (r *HeadroomRaw) Parse(now time.Time) Headroom {
	h := Headroom{Requests: -1, Tokens: -1}
	if r.seen == 0 {
		return h
	}
	bad := func(reason string) {
		h.Bad++
		if h.BadReasons == nil {
			h.BadReasons = map[string]int{}
		}
		h.BadReasons[reason]++
	}
	count := func(slot int) int64 {
		if r.seen&(1<<slot) == 0 {
			return -1
		}
		if r.repeated&(1<<slot) != 0 {
			bad("repeated")
			return -1
		}
		n, err := strconv.ParseInt(strings.TrimSpace(r.vals[slot]), 10, 64)
		switch {
		case err != nil:
			bad("not_a_number")
			return -1
		case n < 0:
			bad("negative")
			return -1
		}
		return n
	}
	reset := func(slot int, rfc3339 bool) int64 {
		if r.seen&(1<<slot) == 0 {
			return 0
		}
		if r.repeated&(1<<slot) != 0 {
			bad("repeated")
			return 0
		}
		v := strings.TrimSpace(r.vals[slot])
		var d time.Duration
		if rfc3339 {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				bad("bad_reset")
				return 0
			}
			d = t.Sub(now)
		} else {
			var err error
			if d, err = time.ParseDuration(v); err != nil {
				bad("bad_reset")
				return 0
			}
		}
		switch {
		case d < 0 && !rfc3339:
			bad("negative")
			return 0
		case d > maxHeadroomReset:
			// Counted, not trusted: the reset is taken as a day away,
			// which the store caps at max_retry_after_sec; a provider or
			// a man in the middle parks a route no longer than that.
			bad("reset_too_far")
			d = maxHeadroomReset
		case d < 0: // a reset already past: the quota is back
			d = 0
		}
		return now.Add(d).UnixNano()
	}
	h.Requests, h.RequestsReset = count(hrOpenAIRequests), reset(hrOpenAIResetRequests, false)
	h.Tokens, h.TokensReset = count(hrOpenAITokens), reset(hrOpenAIResetTokens, false)
	if n := count(hrAnthRequests); n >= 0 || r.seen&(1<<hrAnthResetRequests) != 0 {
		h.Requests, h.RequestsReset = n, reset(hrAnthResetRequests, true)
	}
	for _, k := range [][2]int{{hrAnthTokens, hrAnthResetTokens}, {hrAnthInputTokens, hrAnthResetInputTokens}, {hrAnthOutputTokens, hrAnthResetOutputTokens}} {
		n := count(k[0])
		at := reset(k[1], true)
		if n >= 0 && (h.Tokens < 0 || n < h.Tokens) {
			h.Tokens, h.TokensReset = n, at
		}
	}
	return h
}

// unknownReset is how long a route whose provider announced less than
// its floor, with no reset (or a reset past), stays saturated: long enough
// to pass the next requests over, short enough that a quota announced
// wrongly costs a second.
const unknownReset = int64(time.Second)

// saturation is what an announced headroom means for a route with floors
// hp (R-H2): the time its saturation ends when a kind with a floor is
// below it (the latest of those kinds' resets), or clear when every kind
// with a floor was announced at or above it, which ends a saturation
// early. A kind not announced, or without a floor, says nothing.
func saturation(h Headroom, hp *breaker.Headroom, now int64) (until int64, clear bool) {
	judged := false
	check := func(remaining, reset, floor int64) {
		if floor <= 0 || remaining < 0 {
			return
		}
		judged = true
		if remaining >= floor {
			return
		}
		if reset <= now {
			reset = now + unknownReset
		}
		until = max(until, reset)
	}
	check(h.Requests, h.RequestsReset, hp.MinRequests)
	check(h.Tokens, h.TokensReset, hp.MinTokens)
	if until != 0 {
		return until, false
	}
	return 0, judged
}

// LoggedHeadroom reads what an access log line kept of a response's quota
// (the shipped json_format's ratelimit_* fields: remaining requests and
// their reset, remaining tokens and theirs, each OpenAI's header or else
// Anthropic's) as the response path reads the headers: a reset that is an
// RFC 3339 time is Anthropic's, any other a duration. Empty and "-" are
// absent.
func LoggedHeadroom(requests, requestsReset, tokens, tokensReset string, now time.Time) Headroom {
	var r HeadroomRaw
	keep := func(slot int, v string) {
		if v != "" && v != "-" {
			r.Add(slot, v)
		}
	}
	for _, k := range []struct {
		count, reset string
		slots        [4]int // OpenAI's count and reset, Anthropic's
	}{
		{requests, requestsReset, [4]int{hrOpenAIRequests, hrOpenAIResetRequests, hrAnthRequests, hrAnthResetRequests}},
		{tokens, tokensReset, [4]int{hrOpenAITokens, hrOpenAIResetTokens, hrAnthTokens, hrAnthResetTokens}},
	} {
		s := k.slots[:2]
		if strings.ContainsRune(k.reset, 'T') && strings.ContainsRune(k.reset, ':') {
			s = k.slots[2:]
		}
		keep(s[0], k.count)
		keep(s[1], k.reset)
	}
	return r.Parse(now)
}

// Saturation is what an announced headroom means for a route with floors
// hp at now (R-H2), as the response path judges it: the time the
// saturation ends, or clear when it announced enough (replay evaluates a
// candidate's headroom with it, R-H5).
func Saturation(h Headroom, hp *breaker.Headroom, now int64) (until int64, clear bool) {
	if hp == nil {
		return 0, false
	}
	return saturation(h, hp, now)
}

// Any says whether the response carried any rate-limit header.
func (r *HeadroomRaw) Any() bool { return r.seen != 0 }
