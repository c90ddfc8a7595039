package processor

import (
	"bytes"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Envoy's legacy response-flag bits, as response.flags carries them
// (docs/ext_proc.md, Attributes).
const (
	flagUH    = 0x2
	flagUT    = 0x4
	flagLR    = 0x8
	flagUR    = 0x10
	flagUF    = 0x20
	flagUC    = 0x40
	flagUO    = 0x80
	flagNR    = 0x100
	flagURX   = 0x8000
	flagSI    = 0x10000 // stream idle timeout: a provider that stalled
	flagUMSDR = 0x80000 // upstream max stream duration reached
	flagDT    = 0x400000
	flagUPE   = 0x800000
	flagNC    = 0x1000000

	connFlags = flagUF | flagUC | flagUR | flagLR | flagUPE | flagUH
	// attemptConnFlags are the flags of an attempt whose connection
	// failed: with UO, the attempt failed and only its retry was refused by
	// the cluster's retry circuit breaker (router.cc sets UO on a
	// NoOverflow retry status), so it is that connection failure (R-O15).
	attemptConnFlags = flagUF | flagUC | flagUR | flagLR | flagUPE
	// timeoutFlags are Envoy's own timeouts of a request (R-AL4): the
	// route timeout, the stream idle timeout, the upstream max stream
	// duration, the downstream duration.
	timeoutFlags = flagUT | flagSI | flagUMSDR | flagDT
)

// respHead is what the response headers say.
type respHead struct {
	status      int
	flags       uint64
	hasFlags    bool
	details     string
	hasDetails  bool
	overloaded  bool
	contentType string
	endOfStream bool
}

// evidence says what the attempt's result still waits for once the
// response headers are read.
type evidence uint8

const (
	// haveAll: the headers alone give the result.
	haveAll evidence = iota
	// needBody: a 2xx; the body decides (R-O6, R-O9..R-O11).
	needBody
	// needSniff: no attributes on a 503/504; Envoy's local-reply text in
	// the body tells a connection failure or timeout from a provider's own
	// status.
	needSniff
)

// judgeHead applies R-O1..R-O3, R-O5, R-O7, R-O12 and R-O15 to the response
// headers. With haveAll the result's Kind is final; RetryAfter is filled in
// by the caller.
func judgeHead(h respHead) (breaker.Result, evidence) {
	r := breaker.Result{Kind: breaker.KindStatus, Status: h.status, ElapsedMs: -1}
	switch {
	case (h.hasFlags && h.flags&flagNC != 0) || h.details == "cluster_not_found":
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonClusterNotFound
		return r, haveAll
	case h.hasFlags && h.flags&flagUO != 0 && h.flags&attemptConnFlags != 0:
		// R-O15: the attempt's connection failed; its retry overflowed.
		r.Kind = breaker.KindConnError
		return r, haveAll
	case (h.hasFlags && h.flags&flagUO != 0) || h.overloaded:
		r.Kind, r.Reason = breaker.KindNeither, breaker.ReasonEnvoyOverflow
		return r, haveAll
	case h.status >= 400 && h.hasFlags && h.flags&(flagSI|flagUMSDR|flagDT) != 0:
		r.Kind = breaker.KindTimeout // a 408 or 504 of Envoy's own timeouts
		return r, haveAll
	case h.status >= 500 && ((h.hasFlags && h.flags&timeoutFlags != 0) || strings.HasPrefix(h.details, "upstream_response_timeout")):
		r.Kind = breaker.KindTimeout
		return r, haveAll
	case h.status >= 500 && ((h.hasFlags && h.flags&connFlags != 0) || strings.HasPrefix(h.details, "upstream_reset_before_response_started")):
		r.Kind = breaker.KindConnError
		return r, haveAll
	case h.status >= 200 && h.status < 300:
		if h.endOfStream {
			r.Kind = breaker.KindAnswered // no body: not an LLM shape (R-O6)
			return r, haveAll
		}
		return r, needBody
	case (h.status == 503 || h.status == 504) && !h.hasFlags && !h.hasDetails && !h.endOfStream && isTextOrNone(h.contentType):
		return r, needSniff
	}
	return r, haveAll
}

func isTextOrNone(ct string) bool {
	return ct == "" || strings.HasPrefix(strings.ToLower(ct), "text/plain")
}

// sniffLimit is how much of a local-reply body the heuristics read.
const sniffLimit = 256

// sniffLocalReply applies the text heuristics to the start of a 503/504 body
// when Envoy sent no attributes: its local replies have fixed texts.
func sniffLocalReply(r breaker.Result, body []byte) breaker.Result {
	switch {
	case bytes.Contains(body, []byte("upstream connect error or disconnect/reset before headers")),
		bytes.Contains(body, []byte("no healthy upstream")):
		r.Kind = breaker.KindConnError
	case r.Status == 504 && bytes.Contains(body, []byte("upstream request timeout")):
		r.Kind = breaker.KindTimeout
	}
	return r
}
