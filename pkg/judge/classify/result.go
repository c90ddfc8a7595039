package classify

import (
	"encoding/json"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Result turns what the body delivered into the attempt's result: the one
// vocabulary the breaker judges (R-O4, R-O6, R-O9..R-O11). res is the
// result known from the response headers; startNs is when the request
// began. A stream is timed by its first visible token (R-T4).
func (c *Classifier) Result(res breaker.Result, startNs, now int64) breaker.Result {
	b := c.Finish(now)
	res.ElapsedMs = (now - startNs) / 1e6
	if c.Streaming() && b.FirstVisibleNs > 0 {
		res.ElapsedMs = (b.FirstVisibleNs - startNs) / 1e6
	}
	res.MaxGapMs = c.t.maxGap / 1e6
	res.Kind, res.Reason = breaker.KindNeither, ""
	switch b.Kind {
	case Answered, NotLLM:
		res.Kind = breaker.KindAnswered
	case DeadTurn:
		if c.selfHosted {
			res.Kind = breaker.KindDeadTurn
		} else {
			res.Reason = breaker.ReasonDeadTurn
		}
	case LengthCap:
		res.Reason = breaker.ReasonLengthCap
	case ReasoningOnly:
		res.Reason = breaker.ReasonReasoningOnly
	case ContentFilter:
		res.Reason = breaker.ReasonContentFilter
	case StreamError, Truncated:
		res.Reason = breaker.ReasonStreamError
	case Unparseable:
		res.Reason = breaker.ReasonUnparseable
	default:
		res.Reason = breaker.ReasonNoOutput
	}
	return res
}

// Complete reports whether the body seen so far is whole by its own
// framing: a stream that sent its end marker, or a JSON document that
// parses. When trailers follow a body and Envoy does not send them (trailer
// mode SKIP), the body's end_of_stream never arrives (docs/ext_proc.md); a complete
// body is then judged, not taken for a client cancel.
func (c *Classifier) Complete() bool {
	switch c.format {
	case formatSSE:
		return c.t.done || c.t.errored
	case formatJSON:
		return !c.tooLarge && len(c.buf) > 0 && json.Valid(c.buf)
	}
	return false
}
