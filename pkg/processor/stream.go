package processor

import (
	"sync/atomic"

	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
	"go.opentelemetry.io/otel/trace"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge/classify"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// stream is the state of one route-role ext_proc stream, i.e. one HTTP
// request, and the judging component both roles share: the chosen route,
// its admission, and the response side (response.go) that judges and
// records one attempt. The attempt role's own request path is
// attemptStream (attempt.go). It is used by one goroutine.
type stream struct {
	s    *Server
	rt   *routes.Runtime
	comp *compiled
	gw   *routes.Gateway

	reqBodyMode  filterv3.ProcessingMode_BodySendMode
	respBodyMode filterv3.ProcessingMode_BodySendMode

	startNs int64 // request headers received (coarse clock)

	// The trace (trace.go): the context Envoy sent on the stream, the
	// decision's span (route role), the attempt's (attempt role), and the
	// channel an outcome recorded on this stream came by ("" = its own).
	traceParent  trace.SpanContext
	span         *tracing.Span
	attemptSpan  *tracing.Attempt
	traceChannel string
	// traceRef: the decision's span as its metadata named it (an entry
	// recorded on a replica that does not hold the span).
	traceRef string

	// label: a broken answer's outcome, recorded, whose count waits for
	// the reason Envoy's entry gives (labelwait.go); nil otherwise.
	label *brokenLabel

	// Request side.
	seenReqHeaders bool
	reqEOS         bool // the request had no body
	contentType    string
	modelName      string // from the header, or the body
	residency      []string
	awaitingBody   bool // the decision waits for the buffered body
	rewriteBody    bool // the chosen route needs the body's model rewritten
	// The request's fingerprint (requestfault.go, R-FD4): hasFP once
	// known; retried: an SDK's retry count above 0; idem: the hash of an
	// idempotency key (never the key).
	fp      fingerprint
	hasFP   bool
	retried bool
	hasIdem bool
	idem    [32]byte
	// faultJudged: this attempt's outcome was judged for request faults.
	faultJudged bool
	// reqBody is the buffered request body while decide runs (its
	// fingerprint), nil otherwise.
	reqBody       []byte
	clientCluster bool // the request carried our cluster header
	path          string

	// Failover (SPEC §11): the route role hands the attempt's judging to
	// the attempt role once it made a chain.
	handedOver bool

	// The decision.
	model   *routes.Model
	chosen  *routes.Route
	target  *breaker.Target
	adm     breaker.TargetAdmission
	tracked bool // outcomes of this attempt are recorded
	first   *routes.Route
	// decisionID names the decision in dynamic metadata (fusebox.decision)
	// for the access log channel; kept: it is in the server's decision
	// table until the stream's end settles its outcome (decisions.go).
	decisionID string
	// attempt is the attempt's number in its decision (1 unless an
	// attempt role or a note says otherwise): with decisionID it keys the
	// attempt's record (R-DL11).
	attempt int
	kept    bool
	// envoyEnded: the response carried Envoy's response flags (one of its
	// own endings), which its access log also reports.
	envoyEnded bool

	// Response side.
	respStarted bool
	recorded    bool
	// outcomeClass and outcomeReason are what record judged, until a
	// reply carries them to Envoy's dynamic metadata (outcome.go).
	outcomeClass, outcomeReason string
	outcomeUsage                classify.Usage
	wait                        judge.Evidence // what the result still needs after the headers
	head                        breaker.Result // the result as the headers gave it
	sniff                       []byte
	classifier                  *classify.Classifier

	// stall is the stream's entry in the server's stall watch (R-T5);
	// stallState settles who counts the attempt's call: the stall watch
	// (stallCounted, it stalled while running) or the outcome
	// (stallClosed). Whoever moves it from stallOpen first wins, so the
	// call is counted exactly once even when both race.
	stall      *stallItem
	stallState atomic.Int32
	// gate: the attempt role's arrival as the note saw it (a replayed
	// token records nothing, R-DL4); nil on the route role.
	gate *lifecycle.ArrivalGate
}

const (
	stallOpen int32 = iota
	stallCounted
	stallClosed
)

func newStream(s *Server) *stream {
	return &stream{s: s, respBodyMode: filterv3.ProcessingMode_STREAMED, reqBodyMode: filterv3.ProcessingMode_BUFFERED}
}

func (st *stream) now() int64 { return st.s.clock.Now().UnixNano() }

// begin takes what any message of either role may carry first: Envoy's
// protocol_config; a second request-headers message is refused (ok false:
// answer with resp).
func (st *stream) begin(req *extprocv3.ProcessingRequest) (resp *extprocv3.ProcessingResponse, ok bool) {
	if pc := req.ProtocolConfig; pc != nil {
		st.reqBodyMode, st.respBodyMode = pc.RequestBodyMode, pc.ResponseBodyMode
	}
	if req.GetRequestHeaders() != nil {
		if st.seenReqHeaders {
			return st.spurious(req), false
		}
		st.seenReqHeaders = true
	}
	return nil, true
}

func (st *stream) handle(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if resp, ok := st.begin(req); !ok {
		return resp
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.onRequestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	}
	if st.rt != nil && (st.rt.Envoy.Failover || st.rt.Envoy.Observer) {
		if _, ok := req.Request.(*extprocv3.ProcessingRequest_ResponseHeaders); ok && st.rt.Envoy.Failover {
			st.s.mismatch(MismatchResponseInFail)
		}
		// The failover deployment: the attempt role records every
		// attempt, so the route role never does, whatever response
		// messages reach it (R-X8). The observer deployment: the
		// observer records every response (observe.go).
		return extproc.ContinueReply(req)
	}
	return st.onResponse(req)
}

// onResponse is the judging component's response side, shared by both
// roles: it judges the attempt from its response and records it; the reply
// that follows the record carries the outcome to the access log.
func (st *stream) onResponse(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	return st.withOutcome(st.judgeResponse(req))
}

func (st *stream) judgeResponse(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if st.respStarted {
			return st.spurious(req)
		}
		return st.onResponseHeaders(r.ResponseHeaders, req)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.onResponseEnd()
		return extproc.ContinueReply(req)
	}
	// Request trailers and anything else: the reply of the matching kind.
	return extproc.ContinueReply(req)
}

// spurious answers a duplicate message with the reply of its kind and
// changes nothing.
func (st *stream) spurious(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	st.s.log.Warn("duplicate ext_proc message ignored", "phase", phaseOf(req))
	return extproc.ContinueReply(req)
}

// fallback is the reply after a panic (R-D7): dispatch to the chosen or
// first candidate when one can be known, otherwise pass through.
func (st *stream) fallback(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders, *extprocv3.ProcessingRequest_RequestBody:
		r := st.chosen
		if r == nil {
			r = st.first
		}
		if r == nil {
			r = st.firstCandidate(req)
		}
		if r != nil && !st.respStarted && st.rt != nil {
			cr := &extprocv3.CommonResponse{
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader(st.rt.Headers.Cluster, r.Cluster), extproc.SetHeader(st.rt.Headers.Route, r.Key)}},
				ClearRouteCache: true,
			}
			if _, ok := req.Request.(*extprocv3.ProcessingRequest_RequestHeaders); ok {
				return extproc.HeadersReply(cr)
			}
			return extproc.BodyReply(cr)
		}
	}
	return extproc.ContinueReply(req)
}

// firstCandidate finds the first route for the request without consulting
// any breaker. It runs after a panic, so it must not panic itself.
func (st *stream) firstCandidate(req *extprocv3.ProcessingRequest) (r *routes.Route) {
	defer func() {
		if recover() != nil {
			r = nil
		}
	}()
	if st.gw == nil {
		return nil
	}
	name := st.modelName
	if b := req.GetRequestBody(); b != nil && name == "" {
		if f, err := extproc.ScanModel(b.Body); err == nil && f.Found {
			name = f.Name
		}
	}
	if m, ok := st.gw.Model(name); ok {
		if c := m.Candidates(st.residency); len(c) > 0 {
			return c[0]
		}
	}
	return nil
}
