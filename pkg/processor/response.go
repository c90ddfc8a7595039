package processor

import (
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/processor/classify"
)

func (st *stream) onResponseHeaders(h *extprocv3.HttpHeaders, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	st.respStarted = true
	st.awaitingBody = false
	var head respHead
	var ra, raMs, xmsRaMs string
	if h.Headers != nil {
		for _, hv := range h.Headers.Headers {
			switch hv.Key {
			case ":status":
				head.status, _ = strconv.Atoi(headerValue(hv))
			case "retry-after":
				ra = headerValue(hv)
			case "retry-after-ms":
				raMs = headerValue(hv)
			case "x-ms-retry-after-ms":
				xmsRaMs = headerValue(hv)
			case "x-envoy-overloaded":
				head.overloaded = headerValue(hv) == "true"
			case "content-type":
				head.contentType = headerValue(hv)
			}
		}
	}
	head.endOfStream = h.EndOfStream
	head.flags, head.hasFlags, head.details, head.hasDetails = attributes(req.Attributes)

	var cr *extprocv3.CommonResponse
	if st.chosen != nil {
		cr = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{setHeader(st.rt.Headers.Route, st.chosen.Key)},
		}}
	}
	resp := responseHeadersReply(cr)
	if st.chosen == nil {
		return resp // nothing was routed by fusebox: nothing to judge
	}
	res, v := classifyHead(head)
	if res.Reason == breaker.ReasonClusterNotFound {
		st.s.metrics.ClusterNotFound.WithLabelValues(st.gw.ID, st.chosen.Cluster).Inc()
		st.s.log.Error("Envoy has no cluster for the route fusebox chose: fix the Envoy config or the route's cluster",
			"gateway", st.gw.ID, "route", st.chosen.Key, "cluster", st.chosen.Cluster)
	}
	if !st.tracked {
		return resp
	}
	now := st.now()
	if res.Kind == breaker.KindStatus {
		res.RetryAfterUnixNano = retryAfterDeadline(time.Unix(0, now), ra, raMs, xmsRaMs)
	}
	st.verdict = v
	switch v {
	case verdictDecided:
		res.ElapsedMs = (now - st.startNs) / 1e6
		st.record(res, now)
		if !h.EndOfStream && st.respBodyMode != filterv3.ProcessingMode_NONE {
			// The outcome is known: stop streaming the body to us.
			resp.ModeOverride = &filterv3.ProcessingMode{
				ResponseHeaderMode: filterv3.ProcessingMode_SEND,
				ResponseBodyMode:   filterv3.ProcessingMode_NONE,
			}
		}
	case verdictNeedBody:
		if st.respBodyMode == filterv3.ProcessingMode_NONE {
			// Envoy is not configured to show us the body: the status is
			// all there is to judge.
			res.Kind, res.ElapsedMs = breaker.KindAnswered, (now-st.startNs)/1e6
			st.record(res, now)
			break
		}
		st.pending = res
		st.classifier = classify.New(st.chosen.API, head.contentType)
	case verdictSniff:
		if st.respBodyMode == filterv3.ProcessingMode_NONE {
			// No body will come to sniff: judge the status as it is.
			res.ElapsedMs = (now - st.startNs) / 1e6
			st.record(res, now)
			break
		}
		st.pending = res
	}
	return resp
}

func (st *stream) onResponseBody(b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	if !st.tracked || st.recorded || !st.respStarted {
		return resp
	}
	switch st.verdict {
	case verdictSniff:
		if room := sniffLimit - len(st.sniff); room > 0 {
			st.sniff = append(st.sniff, b.Body[:min(room, len(b.Body))]...)
		}
		if b.EndOfStream || len(st.sniff) >= sniffLimit {
			now := st.now()
			res := sniffLocalReply(st.pending, st.sniff)
			res.ElapsedMs = (now - st.startNs) / 1e6
			st.record(res, now)
		}
	case verdictNeedBody:
		st.classifier.Write(b.Body, st.now())
		if b.EndOfStream {
			st.onResponseEnd()
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
	res := st.pending
	res.ElapsedMs = (now - st.startNs) / 1e6
	switch st.verdict {
	case verdictNeedBody:
		v := st.classifier.Finish(now)
		res = bodyResult(res, v, st.chosen.SelfHosted)
		if st.classifier.Streaming() && v.FirstVisibleNs > 0 {
			// R-T4: a stream is slow by its time to the first visible token.
			res.ElapsedMs = (v.FirstVisibleNs - st.startNs) / 1e6
		}
	case verdictSniff:
		res = sniffLocalReply(res, st.sniff)
	}
	st.record(res, now)
}

// bodyResult maps a classifier verdict to the attempt's result (R-O4, R-O6,
// R-O9..R-O11).
func bodyResult(res breaker.Result, v classify.Verdict, selfHosted bool) breaker.Result {
	res.Kind = breaker.KindNeither
	switch v.Kind {
	case classify.Answered, classify.NotLLM:
		res.Kind = breaker.KindAnswered
	case classify.DeadTurn:
		if selfHosted {
			res.Kind = breaker.KindDeadTurn
		} else {
			res.Reason = breaker.ReasonDeadTurn
		}
	case classify.LengthCap:
		res.Reason = breaker.ReasonLengthCap
	case classify.ReasoningOnly:
		res.Reason = breaker.ReasonReasoningOnly
	case classify.ContentFilter:
		res.Reason = breaker.ReasonContentFilter
	case classify.StreamError, classify.Truncated:
		res.Reason = breaker.ReasonStreamError
	case classify.Unparseable:
		res.Reason = breaker.ReasonUnparseable
	default:
		res.Reason = breaker.ReasonNoOutput
	}
	return res
}

// finish runs when the stream ends. An attempt whose response never reached
// end_of_stream was cut off — a client cancel looks exactly like that — and
// is a neither that frees its probe slot (R-O8).
func (st *stream) finish() {
	if st.tracked && !st.recorded {
		st.record(breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel, ElapsedMs: -1}, st.now())
	}
}

// record applies the attempt's result to its route and fleet breakers and
// counts the outcomes. Recording happens once per attempt.
func (st *stream) record(res breaker.Result, now int64) {
	if st.recorded || !st.tracked {
		return
	}
	st.recorded = true
	route, fleet, fleetUsed := st.target.Record(st.s.store, now, st.adm, res)
	m := st.s.metrics.Outcomes
	if st.target.RoutePolicy.Active() {
		m.WithLabelValues(st.gw.ID, st.chosen.Key, route.Outcome.Class.String(), route.Outcome.Reason).Inc()
	}
	if fleetUsed {
		m.WithLabelValues(st.gw.ID, st.chosen.Fleet.BreakerKey(), fleet.Outcome.Class.String(), fleet.Outcome.Reason).Inc()
	}
}
