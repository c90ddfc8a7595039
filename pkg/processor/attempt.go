package processor

import (
	"context"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/tracing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// The attempt role (SPEC §11, R-X2/R-X3): an ext_proc in each provider
// cluster's upstream filter chain sees every attempt Envoy makes for a
// request. The route role hands it the failover chain in one request header
// (AttemptHeader); the attempt learns its number from x-envoy-attempt-count.
// It applies that attempt's route rewrites and records exactly one outcome
// for the attempt, against the route that served it, with the generation
// (and, for a probe, the slot) the route role took when it made the chain.
//
// Why a request header: upstream filters of every attempt decode the same
// request header map, and the upstream header_mutation that strips
// fusebox's other headers runs on that same map, so a header removed in
// attempt 1 is gone in attempt 2 (docs/envoy.md, "In-request failover").
// The chain header therefore stays on the request for every attempt and
// reaches the provider: its value is sealed (token.go, R-X10), so it tells
// a provider nothing of the tenant, the client or the other routes.

// AttemptHeader carries the chain from the route role to the attempt role.
const AttemptHeader = "x-fusebox-attempt"

const (
	attemptCountHeader = "x-envoy-attempt-count"
	expectedHeader     = "x-envoy-expected-rq-timeout-ms"
)

// The attempt token and its groups are the lifecycle's hand-off
// (lifecycle/handoff.go).
type (
	attemptToken = lifecycle.AttemptToken
	attemptGroup = lifecycle.AttemptGroup
)

// parseAttemptToken opens the header value with the fleet's key and reads
// it; anything else than what a route role of this fleet sealed is
// refused.
func (s *Server) parseAttemptToken(tok string) (attemptToken, error) {
	b, err := s.tokens.Open(tok)
	if err != nil {
		return attemptToken{}, lifecycle.ErrToken
	}
	return lifecycle.ParseAttemptPayload(b)
}

// chainToken builds the route role's token for the chain idx of cands; the
// first group carries the stream's admission, later groups an admission
// taken now (closed routes: a generation, no slot).
func (st *stream) chainToken(groups []chainGroup) string {
	t := attemptToken{V: 1, Decision: st.decisionID, Gateway: st.gw.ID, Model: st.modelName, Path: st.path}
	if st.hasFP {
		t.FP, t.Retried = hex.EncodeToString(st.fp[:]), st.retried
	}
	for _, g := range groups {
		t.Chain = append(t.Chain, attemptGroup{Route: g.route.Key, RouteGen: g.adm.Route.Gen, RouteLease: g.adm.Route.Lease,
			FleetGen: g.adm.Fleet.Gen, FleetLease: g.adm.Fleet.Lease})
	}
	return st.s.tokens.Seal(t.Payload())
}

// attemptStream is the attempt role's stream: its own request path (the
// chain, the per-attempt rewrites) and, for judging its response, the
// judging component the route role uses too (j: the chosen route, its
// admission and response.go).
type attemptStream struct {
	j *stream
	n int // the attempt number (x-envoy-attempt-count)
	// expect is the attempt's x-envoy-expected-rq-timeout-ms: the router
	// writes its per-try timeout there (or what is left of the route's)
	// before each attempt's upstream filters run; 0 when absent.
	expect int64
	// model is the model this attempt's route wants in the body.
	model string
}

func newAttemptStream(s *Server) *attemptStream { return &attemptStream{j: newStream(s), n: 1} }

func (a *attemptStream) handle(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	st := a.j
	if resp, ok := st.begin(req); !ok {
		return resp
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return a.onHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return a.onBody(r.RequestBody)
	}
	return st.onResponse(req)
}

// fallback after a panic: CONTINUE, never an immediate response (in the
// upstream chain it would end the request without a retry).
func (a *attemptStream) fallback(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	return extproc.ContinueReply(req)
}

// finish: an attempt that ended before any response headers is parked
// until its request shows why (meet.go); otherwise the judging component
// ends it as any attempt.
func (a *attemptStream) finish() {
	st := a.j
	if st.tracked && !st.recorded && !st.respStarted {
		st.s.meet.park(a)
		return
	}
	st.finish()
}

// onHeaders resolves the attempt's route from the chain and applies its
// header rewrites. It never answers with an immediate response: in the
// upstream chain that would end the request without a retry.
func (a *attemptStream) onHeaders(h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	st := a.j
	st.startNs = st.now()
	st.rt = st.s.cfg.Load()
	st.comp = st.s.compiledFor(st.rt)
	token, path, n, expect := attemptHeaders(h)
	a.n, a.expect = n, expect
	t, err := st.s.parseAttemptToken(token)
	if err != nil {
		if token != "" {
			st.s.metrics.InternalErrors.WithLabelValues("attempt_token").Inc()
		}
		return attemptPassthrough()
	}
	st.decisionID, st.attempt = t.Decision, n
	gw, ok := st.rt.Gateway(t.Gateway)
	if !ok {
		return attemptPassthrough()
	}
	g := t.Chain[t.Group(n)]
	route, ok := gw.Routes[g.Route]
	if !ok {
		return attemptPassthrough() // removed by a reload since the chain was made
	}
	st.gw, st.chosen, st.target = gw, route, st.comp.targets[route]
	if st.target == nil {
		return attemptPassthrough()
	}
	st.modelName = t.Model
	st.attemptFingerprint(t, n)
	st.adm = breaker.TargetAdmission{Route: breaker.Admission{Gen: g.RouteGen, Lease: g.RouteLease},
		Fleet: breaker.Admission{Gen: g.FleetGen, Lease: g.FleetLease}}
	if n > 1 {
		// The first group's slot belongs to attempt 1 only.
		st.adm.Route.Lease, st.adm.Fleet.Lease = 0, 0
	}
	st.tracked = !st.target.Peek(context.Background(), st.s.store, st.startNs).Off
	if st.s.tracer != nil && st.decisionID != "" {
		// Under its decision's span, when the decision was traced here.
		if dec := st.s.traced.get(st.decisionID); dec != nil {
			st.attemptSpan = dec.Attempt(n, route.Key, route.Provider, time.Unix(0, st.startNs))
		} else {
			// Another replica's decision: under the attempt's own
			// context from Envoy, in the request's trace.
			st.attemptSpan = st.s.tracer.AttemptIn(st.traceParent, n, route.Key, route.Provider, time.Unix(0, st.startNs))
		}
	}
	// A previous attempt of this request that ended before any response
	// headers was retried by Envoy: its connection failed or was reset.
	// The note hears of every attempt's arrival: an attempt number seen
	// twice is a replayed token, whose outcome is recorded nowhere.
	st.gate = lifecycle.NewArrivalGate(st.s.clock)
	st.s.meet.arrived(st.decisionID, n, st.gate)

	// Per-attempt rewrites (R-X2): the header map is shared by every
	// attempt, so :path is set on each one, back to the client's when the
	// route has none; the body is the route role's (route 1's), so its
	// model is rewritten when this route wants another.
	want := route.Path
	if want == "" {
		want = t.Path
	}
	var cr *extprocv3.CommonResponse
	if want != "" && want != path {
		cr = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader(":path", want)}}}
	}
	a.model = route.UpstreamModel
	if a.model == "" {
		a.model = t.Model
	}
	st.rewriteBody = !h.EndOfStream && a.model != ""
	resp := extproc.HeadersReply(cr)
	if !st.rewriteBody && !h.EndOfStream {
		// Nothing to rewrite: Envoy need not send the body to fusebox.
		resp.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_NONE,
			ResponseHeaderMode: filterv3.ProcessingMode_SEND, ResponseBodyMode: st.respBodyMode}
	}
	return resp
}

// attemptHeaders reads the chain token, :path and the attempt number (1
// when Envoy sent none).
func attemptHeaders(h *extprocv3.HttpHeaders) (token, path string, n int, expect int64) {
	n = 1
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.Key {
		case AttemptHeader:
			token = extproc.HeaderValue(hv)
		case attemptCountHeader:
			if v, err := strconv.Atoi(extproc.HeaderValue(hv)); err == nil && v > 0 {
				n = v
			}
		case expectedHeader:
			if v, err := strconv.ParseInt(extproc.HeaderValue(hv), 10, 64); err == nil && v > 0 {
				expect = v
			}
		case ":path":
			path = extproc.HeaderValue(hv)
		}
	}
	return token, path, n, expect
}

// attemptPassthrough answers a request that is none of fusebox's (no
// chain, a forged one, a route gone since): nothing to rewrite or record,
// so Envoy is asked for no further phase of it (the attempt role's filter
// allows mode overrides). It is never an immediate response.
func attemptPassthrough() *extprocv3.ProcessingResponse {
	resp := extproc.HeadersReply(nil)
	resp.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_NONE,
		ResponseHeaderMode: filterv3.ProcessingMode_SKIP, ResponseBodyMode: filterv3.ProcessingMode_NONE}
	return resp
}

// onBody rewrites the body's model for this attempt's route when it
// differs from what the body holds.
func (a *attemptStream) onBody(b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	st := a.j
	if !st.rewriteBody || !st.bodyComplete(b) {
		return extproc.BodyReply(nil)
	}
	st.rewriteBody = false
	f, err := extproc.ScanModel(b.Body)
	if err != nil || !f.Found || f.Name == a.model {
		return extproc.BodyReply(nil)
	}
	nb := extproc.RewriteModel(b.Body, f, a.model)
	return extproc.BodyReply(&extprocv3.CommonResponse{
		HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{extproc.SetHeader("content-length", strconv.Itoa(len(nb)))}},
		BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: nb}},
	})
}

// recordRetried records a parked attempt that Envoy retried: it ended
// before any response headers, after p.Elapsed as measured where it parked
// (R-DL6). One that ran for its whole per-try timeout
// (the router reset it when the timer fired; a retry follows, since the
// shipped policy retries on reset) is a timeout; any other ended on a
// connect failure or a reset, a connection error.
func (st *stream) recordRetried(p lifecycle.Park) {
	if p.Expect > 0 && p.Elapsed+perTrySlackMs >= p.Expect {
		st.record(breaker.Result{Kind: breaker.KindTimeout, Reason: breaker.ReasonTimeout, ElapsedMs: p.Elapsed}, st.now())
		return
	}
	st.record(breaker.Result{Kind: breaker.KindConnError, Reason: breaker.ReasonConnection, ElapsedMs: p.Elapsed}, st.now())
}

// perTrySlackMs absorbs the clocks' granularity: Envoy's per-try timer
// starts after the attempt's headers reached fusebox (the pool is ready,
// the request complete), so an attempt its timer ended ran at least that
// long as fusebox measures it, give or take a millisecond of rounding.
const perTrySlackMs = 5

func (st *stream) recordNeither() {
	st.record(breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel, ElapsedMs: -1}, st.now())
}

// recordNeitherExpired: nothing said what became of the decision within
// its wait; a neither that frees its slot, named for what happened (not a
// client cancel).
func (st *stream) recordNeitherExpired() {
	st.traceChannel = tracing.ChannelExpiry
	st.record(breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonNoOutcome, ElapsedMs: -1}, st.now())
}
