package processor

import (
	"context"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/judge"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge/classify"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// The response phase, in three steps per message: parse what Envoy sent,
// judge it into the attempt's breaker.Result (recording it once it is
// known), and reply.

func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	st.respStarted = true
	st.awaitingBody = false
	if st.chosen == nil {
		return extproc.ResponseHeadersReply(nil) // nothing was routed by fusebox: nothing to judge
	}
	p := judge.ParseHeaders(h, req)
	st.envoyEnded = p.HasFlags && p.Flags != 0
	stopBody := st.judgeHead(p)
	return st.replyResponseHeaders(stopBody)
}

// judgeHead judges the response headers; it reports whether the result is
// known so that Envoy can stop sending the body.
func (st *stream) judgeHead(p judge.Headers) (stopBody bool) {
	res, wait := judge.JudgeHead(p.Head)
	st.reportClusterNotFound(res)
	if p.Headroom.Any() {
		h, at := st.noteHeadroom(&p.Headroom)
		if hp := st.chosen.Policy.Headroom; hp != nil && st.tracked {
			res.SaturateUntil, res.Unsaturate = judge.Saturation(h, hp, at)
		}
	}
	if !st.tracked {
		return false
	}
	now := st.now()
	if res.Kind == breaker.KindStatus {
		res.RetryAfterUnixNano = judge.RetryAfterDeadline(time.Unix(0, now), p.RetryAfter, p.RetryAfterMs, p.XMSRetryAfterMs)
	}
	noBody := st.respBodyMode == filterv3.ProcessingMode_NONE
	switch {
	case wait == judge.HaveAll:
		st.record(st.timed(res, now), now)
		return !p.EndOfStream && !noBody
	case noBody && wait == judge.NeedBody:
		// Envoy is not configured to show us the body: the status is all
		// there is to judge.
		res.Kind = breaker.KindAnswered
		st.record(st.timed(res, now), now)
	case noBody:
		// No body will come to sniff: judge the status as it is.
		st.record(st.timed(res, now), now)
	default:
		st.wait, st.head = wait, res
		if wait == judge.NeedBody {
			st.classifier = classify.NewForRoute(st.chosen.API, p.ContentType, st.chosen.SelfHosted)
			st.classifier.TrackGaps = st.chosen.Policy.StallMs > 0
		}
	}
	return false
}

// reportClusterNotFound logs and counts R-O12 (Envoy had no cluster for
// the route fusebox chose), whichever channel told it.
func (st *stream) reportClusterNotFound(res breaker.Result) {
	if res.Reason != breaker.ReasonClusterNotFound {
		return
	}
	st.s.metrics.ClusterNotFound.WithLabelValues(st.gw.ID, st.chosen.Cluster).Inc()
	st.s.log.Error("Envoy has no cluster for the route fusebox chose: fix the Envoy config or the route's cluster",
		"gateway", st.gw.ID, "route", st.chosen.Key, "cluster", st.chosen.Cluster)
}

// noteHeadroom shows what the chosen route's provider announced of its
// quota (R-H4), and counts the values it did not trust (R-H6).
func (st *stream) noteHeadroom(raw *judge.HeadroomRaw) (judge.Headroom, int64) {
	now := st.now()
	h := raw.Parse(time.Unix(0, now))
	for reason, n := range h.BadReasons {
		st.s.metrics.HeadroomIgnored.WithLabelValues(reason).Add(float64(n))
	}
	if h.Requests >= 0 {
		st.s.metrics.RouteHeadroom.WithLabelValues(st.gw.ID, st.chosen.Key, "requests").Set(float64(h.Requests))
	}
	if h.Tokens >= 0 {
		st.s.metrics.RouteHeadroom.WithLabelValues(st.gw.ID, st.chosen.Key, "tokens").Set(float64(h.Tokens))
	}
	return h, now
}

// timed sets the attempt's total time.
func (st *stream) timed(res breaker.Result, now int64) breaker.Result {
	res.ElapsedMs = (now - st.startNs) / 1e6
	return res
}

func (st *stream) replyResponseHeaders(stopBody bool) *extprocv3.ProcessingResponse {
	resp := extproc.ResponseHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader(st.rt.Headers.Route, st.chosen.Key)},
	}})
	if stopBody {
		// The outcome is known: stop streaming the body to us.
		resp.ModeOverride = &filterv3.ProcessingMode{
			ResponseHeaderMode: filterv3.ProcessingMode_SEND,
			ResponseBodyMode:   filterv3.ProcessingMode_NONE,
		}
	}
	return resp
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	resp := extproc.ResponseBodyContinue
	if !st.tracked || st.recorded || !st.respStarted {
		return resp
	}
	switch st.wait {
	case judge.NeedSniff:
		if room := judge.SniffLimit - len(st.sniff); room > 0 {
			st.sniff = append(st.sniff, b.Body[:min(room, len(b.Body))]...)
		}
		if b.EndOfStream || len(st.sniff) >= judge.SniffLimit {
			now := st.now()
			st.record(st.timed(judge.SniffLocalReply(st.head, st.sniff), now), now)
		}
	case judge.NeedBody:
		st.classifier.Write(b.Body, st.now())
		if b.EndOfStream {
			st.onResponseEnd()
		} else if stall := st.chosen.Policy.StallMs; stall > 0 && st.classifier.Streaming() {
			if lp := st.classifier.LastProgress(); lp > 0 {
				st.s.stalls.touch(st, lp, stall*1e6)
			}
		}
	}
	return resp
}

// onResponseEnd: the response finished cleanly (end_of_stream, or
// trailers). A 2xx is judged by what its body delivered.
func (st *stream) onResponseEnd() {
	if !st.tracked || st.recorded || !st.respStarted {
		return
	}
	now := st.now()
	switch st.wait {
	case judge.NeedBody:
		st.record(st.classifier.Result(st.head, st.startNs, now), now)
	case judge.NeedSniff:
		st.record(st.timed(judge.SniffLocalReply(st.head, st.sniff), now), now)
	default:
		st.record(st.timed(st.head, now), now)
	}
}

// finish runs when the stream ends. An attempt whose response never reached
// end_of_stream was cut off — a client cancel looks exactly like that — and
// is a neither that frees its probe slot (R-O8). The exception is a body
// already whole by its own framing: with trailers that Envoy does not send
// (trailer mode SKIP), end_of_stream never comes for a complete response.
//
// A stream that saw no response at all may have met one of Envoy's own
// local replies the route role is never shown (Envoy 1.34–1.36): the access
// log channel settles it (finishDecision).
func (st *stream) finish() {
	if st.span != nil {
		defer st.span.End(time.Unix(0, st.now())) // the route role's stream ends here
	}
	if st.attemptSpan != nil {
		defer st.attemptSpan.End(time.Unix(0, st.now())) // and the attempt role's
	}
	switch {
	case !st.tracked || st.recorded:
	case st.handedOver && !st.respStarted:
		// The attempt role judges every attempt (R-X3); the route role's
		// stream ends after the request phase.
		return
	case st.respStarted && st.wait == judge.NeedBody && st.classifier.Complete():
		st.onResponseEnd()
	case !st.kept && st.respStarted:
		st.recordBroken()
	case !st.kept:
		st.recordNeither()
	}
	if st.kept {
		st.finishDecision(!st.respStarted)
	}
}

// record applies the attempt's result to its route and fleet breakers and
// counts the outcomes. Recording happens once per attempt.
func (st *stream) record(res breaker.Result, now int64) {
	if st.recorded || !st.tracked {
		return
	}
	st.recorded = true
	if st.stall != nil {
		st.s.stalls.forget(st)
	}
	// Close the stall watch for this attempt; if it already counted the
	// call, the outcome must not count it again.
	res.Counted = !st.stallState.CompareAndSwap(stallOpen, stallClosed)
	if g := st.gate; g != nil {
		known, replay := g.Known()
		switch {
		case replay:
			return // counted when the note said so (meet.go)
		case !known:
			// The note has not answered the arrival yet: the record waits
			// for it off the reply path (the access log line then lacks
			// the outcome).
			go func() {
				if g.Wait() {
					return
				}
				st.apply(res, now, false)
			}()
			return
		}
	}
	st.apply(res, now, true)
}

// keyRecord keys a real outcome by its decision and attempt
// (lifecycle.RecordKey, R-DL11).
func (st *stream) keyRecord(res *breaker.Result) {
	if st.decisionID == "" || res.Kind == breaker.KindNeither {
		return
	}
	res.Key = lifecycle.RecordKey(st.decisionID, st.attempt)
	if st.rt != nil {
		res.KeyLifeMs = lifecycle.RecordKeyLife(st.rt.DecisionWait, st.rt.AccessLogWait).Milliseconds()
	}
}

// apply records res on the attempt's breakers and counts it; withMeta: the
// reply that follows carries the outcome to the access log.
func (st *stream) apply(res breaker.Result, now int64, withMeta bool) {
	if st.judgeAside(res, now, withMeta) {
		return // judged and recorded (requestfault.go)
	}
	st.applyJudged(res, now, withMeta)
}

// applyJudged is apply once request faults are judged.
func (st *stream) applyJudged(res breaker.Result, now int64, withMeta bool) {
	base := st.comp.bases[st.chosen]
	if base != nil {
		res.BaselineMs = base.P50(now)
	}
	st.keyRecord(&res)
	if st.hasFP && !st.faultJudged && st.chosen.Policy.RequestFaultTTLSec > 0 {
		res = st.requestFault(res, now, false)
	}
	if res.DecidedAt == 0 {
		// When the attempt was sent: an announcement of enough headroom
		// ends a saturation only for a request sent after it began (R-H7).
		res.DecidedAt = st.startNs
	}
	route, fleet, err := st.target.Record(context.Background(), st.s.store, now, st.adm, res)
	if route.AlreadyApplied || fleet.AlreadyApplied {
		// Another channel or replica recorded this attempt first (R-DL11):
		// counted as a duplicate, recorded nowhere.
		st.s.metrics.DecisionEvents.WithLabelValues("record", "already_applied").Inc()
	}
	if base != nil && route.Applied && route.Outcome.Class == breaker.Success {
		base.Add(res.ElapsedMs, now)
		if res.BaselineMs > 0 {
			st.s.metrics.RouteBaseline.WithLabelValues(st.gw.ID, st.chosen.Key).Set(float64(res.BaselineMs) / 1e3)
		}
	}
	if err != nil && err != breaker.ErrUnknown {
		st.s.metrics.StoreErrors.WithLabelValues("record").Inc()
	}
	m := st.s.metrics.Outcomes
	if route.Applied {
		// The outcome goes into the access log line too (R-R1): the reply
		// to the message that settled it carries it (outcome.go).
		if withMeta {
			st.outcomeClass, st.outcomeReason = route.Outcome.Class.String(), route.Outcome.Reason
			if st.classifier != nil {
				st.outcomeUsage = st.classifier.Usage()
			}
		}
		if st.label != nil {
			st.label.route = true // counted once its label is known (labelwait.go)
		} else {
			m.WithLabelValues(st.gw.ID, st.chosen.Key, route.Outcome.Class.String(), route.Outcome.Reason, route.Outcome.Origin()).Inc()
		}
		st.s.history.Add(st.target.Route.ID(), route.Outcome.Class, now)
	}
	if st.s.tracer != nil && route.Applied {
		st.traceOutcome(route, fleet, now)
	}
	if fleet.Applied {
		if st.label != nil {
			st.label.fleet = true
		} else {
			m.WithLabelValues(st.gw.ID, st.chosen.Fleet.BreakerKey(), fleet.Outcome.Class.String(), fleet.Outcome.Reason, fleet.Outcome.Origin()).Inc()
		}
	}
}
