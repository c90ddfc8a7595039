package judge

import (
	"bytes"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Envoy's legacy response-flag bits, as response.Flags carries them
// (docs/ext_proc.md, Attributes).
const (
	FlagUH    = 0x2
	FlagUT    = 0x4
	FlagLR    = 0x8
	FlagUR    = 0x10
	FlagUF    = 0x20
	FlagUC    = 0x40
	FlagUO    = 0x80
	FlagNR    = 0x100
	FlagDC    = 0x4000 // downstream connection termination
	FlagURX   = 0x8000
	FlagSI    = 0x10000 // stream idle timeout: a provider that stalled
	FlagUMSDR = 0x80000 // upstream max stream duration reached
	FlagDT    = 0x400000
	FlagUPE   = 0x800000
	FlagNC    = 0x1000000
	FlagDR    = 0x10000000 // downstream remote reset: an HTTP/2 client's RST_STREAM

	// ClientFlags are a client that went away (R-AL4: a neither,
	// client_cancel).
	ClientFlags = FlagDC | FlagDR

	ConnFlags = FlagUF | FlagUC | FlagUR | FlagLR | FlagUPE | FlagUH
	// AttemptConnFlags are the flags of an attempt whose connection
	// failed: with UO, the attempt failed and only its retry was refused by
	// the cluster's retry circuit breaker (router.cc sets UO on a
	// NoOverflow retry status), so it is that connection failure (R-O15).
	AttemptConnFlags = FlagUF | FlagUC | FlagUR | FlagLR | FlagUPE
	// TimeoutFlags are Envoy's own timeouts of a request (R-AL4): the
	// route timeout, the stream idle timeout, the upstream max stream
	// duration, the downstream duration.
	TimeoutFlags = FlagUT | FlagSI | FlagUMSDR | FlagDT
)

// Head is what the response headers say.
type Head struct {
	Status      int
	Flags       uint64
	HasFlags    bool
	Details     string
	HasDetails  bool
	Overloaded  bool
	ContentType string
	EndOfStream bool
}

// Evidence says what the attempt's result still waits for once the
// response headers are read.
type Evidence uint8

const (
	// haveAll: the headers alone give the result.
	HaveAll Evidence = iota
	// needBody: a 2xx; the body decides (R-O6, R-O9..R-O11).
	NeedBody
	// needSniff: no attributes on a 503/504; Envoy's local-reply text in
	// the body tells a connection failure or timeout from a provider's own
	// status.
	NeedSniff
)

// JudgeHead applies R-O1..R-O3, R-O5, R-O7, R-O12 and R-O15 to the response
// headers. With HaveAll the result's Kind is final; RetryAfter is filled in
// by the caller.
func JudgeHead(h Head) (breaker.Result, Evidence) {
	r := breaker.Result{Kind: breaker.KindStatus, Status: h.Status, ElapsedMs: -1}
	switch {
	case (h.HasFlags && h.Flags&FlagNC != 0) || h.Details == "cluster_not_found":
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonClusterNotFound
		return r, HaveAll
	case h.HasFlags && h.Flags&FlagUO != 0 && h.Flags&AttemptConnFlags != 0:
		// R-O15: the attempt's connection failed; its retry overflowed.
		r.Kind = breaker.KindConnError
		return r, HaveAll
	case (h.HasFlags && h.Flags&FlagUO != 0 && h.Details != "via_upstream") || h.Overloaded:
		// UO on the provider's own answer (via_upstream) only says its
		// retry was refused: the answer is judged by its status (R-AL4).
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonEnvoyOverflow
		return r, HaveAll
	case h.HasFlags && h.Flags&TimeoutFlags != 0 && answerBegan(h):
		// R-AL4: Envoy's timer cut an answer that was flowing (a 200 with
		// UT after the route timeout): neither way.
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonCutMidAnswer
		return r, HaveAll
	case h.HasFlags && h.Flags&AttemptConnFlags != 0 && h.Status >= 200 && h.Status < 300 && answerBegan(h):
		// R-O9: the provider's answer began and its stream broke (an
		// upstream reset mid-answer, UR; router.cc onUpstreamReset once
		// the response started): neither way, and not a client_cancel.
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonStreamError
		return r, HaveAll
	case h.HasFlags && h.Flags&AttemptConnFlags != 0 && answerBegan(h):
		// A provider's non-2xx answer whose stream then broke: the status
		// it gave is its answer (R-O1), not a connection error.
		return r, HaveAll
	case h.Status >= 400 && h.HasFlags && h.Flags&(FlagSI|FlagUMSDR|FlagDT) != 0:
		r.Kind = breaker.KindTimeout // a 408 or 504 of Envoy's own timeouts
		return r, HaveAll
	case h.Status >= 500 && ((h.HasFlags && h.Flags&TimeoutFlags != 0) || strings.HasPrefix(h.Details, "upstream_response_timeout")):
		r.Kind = breaker.KindTimeout
		return r, HaveAll
	case h.Status >= 500 && ((h.HasFlags && h.Flags&ConnFlags != 0) || strings.HasPrefix(h.Details, "upstream_reset_before_response_started")):
		r.Kind = breaker.KindConnError
		return r, HaveAll
	case h.Status >= 200 && h.Status < 300:
		if h.EndOfStream {
			r.Kind = breaker.KindAnswered // no body: not an LLM shape (R-O6)
			return r, HaveAll
		}
		return r, NeedBody
	case (h.Status == 503 || h.Status == 504) && !h.HasFlags && !h.HasDetails && !h.EndOfStream && isTextOrNone(h.ContentType):
		return r, NeedSniff
	}
	return r, HaveAll
}

// answerBegan reports whether the provider's answer had begun when Envoy
// ended the request: its details say the response came from upstream (or
// that the upstream reset after it started), or
// its status is a success Envoy never answers with itself (its own timeout
// replies are 504 and 408, with their own details).
func answerBegan(h Head) bool {
	return h.Details == "via_upstream" || strings.HasPrefix(h.Details, "upstream_reset_after_response_started") ||
		h.Status >= 200 && h.Status < 300
}

func isTextOrNone(ct string) bool {
	return ct == "" || strings.HasPrefix(strings.ToLower(ct), "text/plain")
}

// SniffLimit is how much of a local-reply body the heuristics read.
const SniffLimit = 256

// SniffLocalReply applies the text heuristics to the start of a 503/504 body
// when Envoy sent no attributes: its local replies have fixed texts.
func SniffLocalReply(r breaker.Result, body []byte) breaker.Result {
	switch {
	case bytes.Contains(body, []byte("upstream connect error or disconnect/reset before headers")),
		bytes.Contains(body, []byte("no healthy upstream")):
		r.Kind = breaker.KindConnError
	case r.Status == 504 && bytes.Contains(body, []byte("upstream request timeout")):
		r.Kind = breaker.KindTimeout
	}
	return r
}
