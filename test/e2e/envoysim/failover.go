package envoysim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// FailoverConfig plays Envoy >= 1.40's in-request failover (envoy/
// envoy-failover.yaml; the facts and their sources are in docs/envoy.md,
// "In-request failover"):
//   - route (a) uses the priority_group cluster specifier: the group of
//     attempt k is min(k-1, groups-1), read from the request's dynamic
//     metadata in Namespace at every attempt (refresh_cluster_on_retry),
//     else the configured groups; an unknown cluster is a 503 NC, no retry;
//   - x-envoy-attempt-count is set on the request (the shared header map)
//     before each attempt's upstream filters run;
//   - each attempt runs the cluster's upstream chain: a new attempt-role
//     ext_proc stream on the router's header map (edits persist into the
//     next attempt) and a fresh copy of the router's buffered body, then a
//     header_mutation that removes Remove (on the same map), then the
//     cluster's credential;
//   - retries on connect-failure, reset and the retriable status codes, at
//     most NumRetries; nothing is retried once response headers went
//     downstream; an immediate response from the attempt role is a local
//     reply that ends the request;
//   - per_try_timeout bounds each attempt until its response headers: when
//     it fires the router resets the attempt (and its ext_proc stream) and
//     retries it as a reset (maybeRetryReset(LocalReset, TimeoutRetry::Yes):
//     retried under reset, 5xx or gateway-error); the last one is a 504 UT
//     with upstream_per_try_timeout;
//   - before each attempt the router writes x-envoy-expected-rq-timeout-ms
//     on the shared header map (setTimeoutHeaders: the per-try timeout, or
//     what is left of the route's, at least 1), unless the router filter
//     has suppress_envoy_headers.
type FailoverConfig struct {
	Namespace            string
	Groups               []string // the configured groups' clusters
	RetryOn              []string // connect-failure, reset, retriable-status-codes
	RetriableStatusCodes []int
	NumRetries           int
	// PerTryTimeout is the retry policy's per_try_timeout (0: none).
	PerTryTimeout time.Duration
	// SuppressEnvoyHeaders is the router filter's suppress_envoy_headers:
	// no x-envoy-expected-rq-timeout-ms is written.
	SuppressEnvoyHeaders bool
	IncludeAttemptCount  bool
	// Attempt is the upstream ext_proc (attempt role); Addr "" = none.
	Attempt ExtProcConfig
	// Remove are the headers the upstream header_mutation removes.
	Remove []string
	// Credentials: per cluster, the header credential_injector sets.
	Credentials map[string][2]string
}

// AttemptLog is one attempt as the provider cluster saw it (tests read it).
type AttemptLog struct {
	N       int
	Cluster string
	Status  int // 0 = no response (connect failure, reset)
}

// failoverGroups returns the clusters of the chain: fusebox's override when
// the namespace holds one, else the configured groups.
func (p *Proxy) failoverGroups(e *Entry) []string {
	fo := p.cfg.Failover
	if md, ok := e.Metadata[fo.Namespace]; ok {
		var out []string
		for _, g := range md.Fields["priority_groups"].GetListValue().GetValues() {
			cs := g.GetStructValue().Fields["clusters"].GetListValue().GetValues()
			if len(cs) == 0 {
				continue
			}
			out = append(out, cs[0].GetStructValue().Fields["cluster_name"].GetStringValue())
		}
		if len(out) > 0 {
			return out
		}
	}
	return fo.Groups
}

func (p *Proxy) retriable(status int) bool {
	fo := p.cfg.Failover
	if !contains(fo.RetryOn, "retriable-status-codes") {
		return false
	}
	for _, c := range fo.RetriableStatusCodes {
		if c == status {
			return true
		}
	}
	return false
}

// retriesReset is wouldRetryFromReset for an attempt that ended before its
// response: a reset (a per-try timeout is a LocalReset) is retried under
// reset, 5xx or gateway-error; a connect failure under connect-failure
// too.
func (p *Proxy) retriesReset(kind string, perTry bool) bool {
	on := p.cfg.Failover.RetryOn
	if contains(on, "reset") || contains(on, "5xx") || contains(on, "gateway-error") {
		return true
	}
	return !perTry && kind == "connect-failure" && contains(on, "connect-failure")
}

// expectedTimeoutMs is what setTimeoutHeaders writes after elapsed: the
// per-try timeout, or the route's when there is none (or it is not
// shorter), capped by what is left of the route's; at least 1 once the
// route's is spent; 0 when neither is set.
func (p *Proxy) expectedTimeoutMs(elapsed time.Duration) int64 {
	global := p.cfg.RouteTimeout.Milliseconds()
	exp := p.cfg.Failover.PerTryTimeout.Milliseconds()
	if exp == 0 || (global > 0 && exp >= global) {
		exp = global
	}
	if exp > 0 && global > 0 {
		if left := global - elapsed.Milliseconds(); left <= 0 {
			exp = 1
		} else {
			exp = min(exp, left)
		}
	}
	return exp
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// failover runs the router with the failover retry policy and answers the
// client. It reports the attempts made.
func (p *Proxy) failover(ctx context.Context, w http.ResponseWriter, r *http.Request, e *Entry, h *headers, body []byte) {
	fo := p.cfg.Failover
	var flags uint64
	numRetries := maxRetries(h, fo.NumRetries, len(fo.RetryOn) > 0)
	// The retry state is built once, in decodeHeaders, with the cluster
	// the request was first routed to: its retry resource is charged for
	// every retry of the request (retries.go).
	slot := &retrySlot{p: p, cluster: p.failoverGroups(e)[0]}
	defer slot.reset()
	begun := time.Now() // the downstream request is complete (buffered)
	// The connection manager's stream idle timer runs over the whole
	// request, attempts and back-offs included (idle.go); it ends the
	// request (no retry): 504 SI before a response, a reset with SI after.
	ictx, idle := p.watchIdle(ctx)
	defer idle.done()
	for n := 1; n <= numRetries+1; n++ {
		// The specifier re-reads the override at every evaluation.
		groups := p.failoverGroups(e)
		cluster := groups[min(n-1, len(groups)-1)]
		e.Cluster, e.Attempts = cluster, n
		if n > 1 {
			p.stats.add("upstream_rq_retry")
		}
		if n == 1 {
			// router.cc decodeHeaders answers NC and UH before it sets the
			// attempt count, and the gRPC logger writes the count only when
			// set: a first attempt's no-host entry has none (docs/envoy.md).
			e.Attempts = 0
		}
		c, ok := p.cfg.Clusters[cluster]
		switch {
		case !ok && n == 1:
			p.stats.add("no_cluster")
			p.writeLocalFlags(w, e, localReply(503, flags|flagNC, "cluster_not_found", ""))
			return
		case !ok:
			// A retry to a cluster that does not exist: doRetry looks it up
			// again (getThreadLocalCluster), finds none, and answers as for
			// no healthy host (sendNoHealthyUpstreamResponse): UH, with the
			// attempt counted. Before, envoysim answered NC here too.
			p.stats.add("no_healthy_upstream")
			p.writeLocalFlags(w, e, localReply(503, flags|flagUH, "no_healthy_upstream", "no healthy upstream"))
			return
		}
		if c.Addr == "" {
			// No healthy host: the router answers 503 UH itself, before any
			// upstream request or upstream filter, and never retries it
			// (decodeHeaders; doRetry does the same after it counted the
			// retry, so a later attempt's entry has its count).
			p.stats.add("no_healthy_upstream")
			p.writeLocalFlags(w, e, localReply(503, flags|flagUH, "no_healthy_upstream", "no healthy upstream"))
			return
		}
		e.Attempts = n
		if fo.IncludeAttemptCount {
			h.set("x-envoy-attempt-count", strconv.Itoa(n))
		}
		if ms := p.expectedTimeoutMs(time.Since(begun)); ms > 0 && !fo.SuppressEnvoyHeaders {
			h.set("x-envoy-expected-rq-timeout-ms", strconv.FormatInt(ms, 10))
		}
		// The cluster's upstream chain, on the shared header map and a
		// fresh copy of the router's body. The router asks the pool for a
		// connection (acceptHeadersFromRouter) before the upstream filters
		// see the request: a refusal resets the attempt, its ext_proc stream
		// with it, even while that filter waits for its reply.
		abody := append([]byte(nil), body...)
		ep := newEPStreamFor(p, &fo.Attempt)
		ep.traceCtx = e.traceCtx
		dialed := make(chan error, 1)
		phaseDone := make(chan struct{})
		go func() {
			err := p.dialProbe(ctx, c.Addr)
			if err != nil {
				// The failure is seen on a later event loop iteration than
				// the one that dialled and ran the filters' headers: their
				// first message went out already.
				select {
				case <-ep.sent:
					// A refusal takes the provider's round trip; here the
					// provider is on loopback, which has none, and a reset
					// right behind the message may overtake it in the
					// server's reads (grpc-go: a stream's cancellation and
					// its buffered data race). fusebox's sidecar link is
					// the shorter one in any real deployment.
					time.Sleep(refusalRTT)
				case <-phaseDone:
				}
				ep.cut()
			}
			dialed <- err
		}()
		stop := p.upstreamRequestPhase(w, e, ep, h, &abody)
		close(phaseDone)
		if derr := <-dialed; derr != nil {
			p.connectFailed(cluster)
			if p.attemptFailed(ctx, w, e, ep, attemptEnd{n: n, retries: numRetries, cluster: cluster, flags: flags, err: derr}, slot) {
				continue
			}
			return
		}
		if stop {
			ep.reset()
			return
		}
		for _, k := range fo.Remove {
			h.del(k)
		}
		if cred, ok := fo.Credentials[cluster]; ok {
			h.set(cred[0], cred[1])
		}
		// Route (a) of the failover file removes no headers itself: the
		// upstream header_mutation above did.
		// The attempt's own context: its per-try timer cancels it until
		// the response headers come.
		actx, cancelTry := context.WithCancel(ictx)
		defer cancelTry()
		var timedOut atomic.Bool
		var perTry *time.Timer
		if fo.PerTryTimeout > 0 {
			perTry = time.AfterFunc(fo.PerTryTimeout, func() { timedOut.Store(true); cancelTry() })
		}
		req, err := p.upstreamRequest(actx, c, *h, abody, nil)
		if err != nil {
			ep.reset()
			p.writeLocalFlags(w, e, localReply(500, 0, "bad_request", err.Error()))
			return
		}
		active := p.active[cluster]
		if active != nil {
			active.Add(1)
		}
		done := func() {
			if active != nil {
				active.Add(-1)
				active = nil
			}
		}
		resp, err := p.transport.RoundTrip(req)
		if perTry != nil && !perTry.Stop() && err == nil {
			// The timer fired as the headers came: the router reset the
			// attempt first.
			resp.Body.Close()
			err = context.Canceled
		}
		if err != nil && errors.Is(context.Cause(ictx), errStreamIdle) {
			done()
			ep.reset()
			p.stats.add("downstream_rq_idle_timeout")
			p.writeLocalFlags(w, e, localReply(504, flags|flagSI, "stream_idle_timeout", "stream timeout"))
			return
		}
		if err != nil {
			done()
			p.lostBeforeHeaders(actx, cluster, err)
			perTryOver := timedOut.Load() && ctx.Err() == nil
			if perTryOver {
				p.stats.add("upstream_rq_per_try_timeout")
			}
			if p.attemptFailed(ctx, w, e, ep, attemptEnd{n: n, retries: numRetries, cluster: cluster, flags: flags, err: err, perTry: perTryOver}, slot) {
				continue
			}
			return
		}
		idle.touch()
		hdr := upstreamHeaders(resp)
		up := &response{status: resp.StatusCode, hdr: hdr, body: &idleBody{ReadCloser: &cxBody{ReadCloser: resp.Body, ctx: actx, p: p, cluster: cluster}, ctx: ictx, w: idle}, details: "via_upstream", flags: flags,
			trailer: func() http.Header { return resp.Trailer }}
		p.logAttempt(AttemptLog{N: n, Cluster: cluster, Status: resp.StatusCode})
		retry := false
		if p.retriable(resp.StatusCode) {
			var f uint64
			retry, f = p.shouldRetry(n, numRetries, slot)
			flags |= f
			up.flags = flags
		}
		if retry {
			// The upstream filters see the response headers before the
			// router decides to retry; then the attempt is reset.
			if ep.active() && headerMode(ep.modes.ResponseHeaderMode, true) {
				rh := headers{{":status", strconv.Itoa(resp.StatusCode)}}
				rh = append(rh, hdr...)
				_, _ = ep.exchange(&extprocv3.ProcessingRequest{
					Request:    &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh.proto()}},
					Attributes: p.attributes(ep.c, up),
				})
			}
			resp.Body.Close()
			done()
			ep.reset()
			if !slot.backoff(ctx) {
				p.requestEnded(ctx, w, e)
				return
			}
			continue
		}
		// The final answer: shouldRetry said no, and resetRetry gave back
		// the previous retry's slot.
		slot.reset()
		defer done()
		// The response goes downstream through the attempt's upstream
		// filter (the route role is configured without response phases):
		// from here nothing is retried.
		defer resp.Body.Close()
		e.Flags, e.Details = flags, "via_upstream"
		p.respond(w, r, e, ep, up)
		return
	}
}

// attemptEnd is an attempt that ended before any response.
type attemptEnd struct {
	n, retries int
	cluster    string
	flags      uint64
	err        error
	perTry     bool // its per-try timer ended it
}

// attemptFailed handles an attempt that got no response (a connect
// failure, a reset, its per-try timeout): the upstream request is reset,
// and so is its filter chain's ext_proc stream; the router retries it when
// its policy and retry resource allow (after the back-off), else answers.
// It reports whether the attempt is retried.
func (p *Proxy) attemptFailed(ctx context.Context, w http.ResponseWriter, e *Entry, ep *epStream, a attemptEnd, slot *retrySlot) bool {
	ep.reset()
	p.logAttempt(AttemptLog{N: a.n, Cluster: a.cluster})
	kind := "reset"
	if isConnectFailure(a.err) {
		kind = "connect-failure"
	}
	if ctx.Err() == nil && p.retriesReset(kind, a.perTry) {
		retry, f := p.shouldRetry(a.n, a.retries, slot)
		if retry {
			if slot.backoff(ctx) {
				return true
			}
			p.requestEnded(ctx, w, e)
			return false
		}
		a.flags |= f
	}
	switch {
	case a.perTry:
		p.writeLocalFlags(w, e, localReply(504, a.flags|flagUT, "upstream_per_try_timeout", "upstream request timeout"))
	case ctx.Err() != nil:
		p.requestEnded(ctx, w, e)
	case kind == "connect-failure":
		p.writeLocalFlags(w, e, localReply(503, a.flags|flagUF, "upstream_reset_before_response_started{remote_connection_failure}",
			"upstream connect error or disconnect/reset before headers. reset reason: connection failure"))
	default:
		p.writeLocalFlags(w, e, localReply(503, a.flags|flagUC, "upstream_reset_before_response_started{connection_termination}",
			"upstream connect error or disconnect/reset before headers. reset reason: connection termination"))
	}
	return false
}

// shouldRetry is the router's answer for an attempt its policy would
// retry (retry_state_impl.cc shouldRetry; router.cc sets the flag): the
// retries are spent (URX, "NoRetryLimitExceeded"), the cluster's retry
// resource refuses it (UO, "NoOverflow"), or it is retried. A request whose
// retry succeeded carries neither. Before, envoysim set URX on every
// retried answer, successes included, and no UO on a refused retry.
func (p *Proxy) shouldRetry(n, retries int, slot *retrySlot) (bool, uint64) {
	if n > retries {
		return false, flagURX
	}
	if !slot.take() {
		return false, flagUO
	}
	return true, 0
}

// requestEnded answers a request whose context ended: the route timeout
// (504 UT), or the client went away (nothing is written: clientGone).
func (p *Proxy) requestEnded(ctx context.Context, w http.ResponseWriter, e *Entry) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		p.writeLocalFlags(w, e, localReply(504, flagUT, "upstream_response_timeout", "upstream request timeout"))
		return
	}
	g := clientGone()
	e.Flags, e.Details = g.flags, g.details
}

// refusalRTT is the least time a refused connection takes to be seen
// after the dial: a network round trip to the provider.
const refusalRTT = 2 * time.Millisecond

// dialProbe is the pool's connection attempt for an upstream request,
// started before the upstream filters run.
func (p *Proxy) dialProbe(ctx context.Context, addr string) error {
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// upstreamRequestPhase runs the attempt role's request phase on the shared
// header map and the attempt's body copy. It reports stop when the attempt
// role answered with an immediate response (a local reply: the request
// ends, no retry).
func (p *Proxy) upstreamRequestPhase(w http.ResponseWriter, e *Entry, ep *epStream, h *headers, body *[]byte) (stop bool) {
	if !ep.active() {
		return false
	}
	// apply takes a request-path reply on the shared header map; from an
	// upstream filter clear_route_cache is ignored (and counted).
	apply := func(cr *extprocv3.CommonResponse) bool {
		if cr.GetClearRouteCache() {
			p.stats.add("clear_route_cache_upstream_ignored")
		}
		if err := p.applyMutationRules(h, cr.GetHeaderMutation(), false, ep.c.AllowEnvoy); err != nil {
			p.writeLocal(w, e, localReply(500, 0, "ext_proc_error", "ext_proc header mutation failed"))
			return false
		}
		return true
	}
	eos := len(*body) == 0
	if headerMode(ep.modes.RequestHeaderMode, true) {
		cr, resp, stop := p.requestPhase(w, e, ep, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: eos}}, Attributes: requestAttributes(ep.c, e.Cluster)},
			func(r *extprocv3.ProcessingResponse) (*extprocv3.CommonResponse, bool) {
				x, ok := r.Response.(*extprocv3.ProcessingResponse_RequestHeaders)
				return x.RequestHeaders.GetResponse(), ok
			})
		if stop {
			return true
		}
		if resp != nil {
			if !apply(cr) {
				return true
			}
			if resp.ModeOverride != nil && ep.c.AllowModeOverride {
				ep.modes = overrideModes(resp.ModeOverride, ep.c)
				if !p.playsOverride(w, e, ep) {
					return true
				}
			}
			p.afterRequestHeaders(ep, eos)
		}
	}
	if !eos && ep.active() && ep.modes.RequestBodyMode == filterv3.ProcessingMode_BUFFERED {
		cr, resp, stop := p.requestPhase(w, e, ep, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: *body, EndOfStream: true}}},
			func(r *extprocv3.ProcessingResponse) (*extprocv3.CommonResponse, bool) {
				x, ok := r.Response.(*extprocv3.ProcessingResponse_RequestBody)
				return x.RequestBody.GetResponse(), ok
			})
		if stop {
			return true
		}
		if resp != nil {
			if !apply(cr) {
				return true
			}
			*body = replacedBody(cr, *body)
		}
	}
	return false
}

// writeLocalFlags answers with a router local reply and its flags.
func (p *Proxy) writeLocalFlags(w http.ResponseWriter, e *Entry, lr *response) {
	e.Flags, e.Details = lr.flags, lr.details
	p.writeLocal(w, e, lr)
}

func (p *Proxy) logAttempt(a AttemptLog) {
	p.attemptMu.Lock()
	p.attempts = append(p.attempts, a)
	p.attemptMu.Unlock()
}

// Attempts returns every attempt made so far, in order, and forgets them.
func (p *Proxy) Attempts() []AttemptLog {
	p.attemptMu.Lock()
	defer p.attemptMu.Unlock()
	out := p.attempts
	p.attempts = nil
	return out
}

// maxRetries is the request's retry budget as the router builds it when
// it decodes the headers (retry_state_impl.cc): x-envoy-max-retries, when
// a filter set it and a retry policy exists, takes precedence over the
// route's num_retries; the router then removes the header, so it never
// reaches an upstream.
func maxRetries(h *headers, configured int, hasPolicy bool) int {
	v, ok := h.get("x-envoy-max-retries")
	h.del("x-envoy-max-retries")
	if !ok || !hasPolicy {
		return configured
	}
	n, err := strconv.ParseUint(v, 10, 31)
	if err != nil {
		return configured
	}
	return int(n)
}

// requestAttributes are the request attributes an upstream filter asks
// for (request_attributes): xds.cluster_name is the attempt's cluster.
func requestAttributes(c *ExtProcConfig, cluster string) map[string]*structpb.Struct {
	if len(c.RequestAttributes) == 0 {
		return nil
	}
	f := map[string]*structpb.Value{}
	for _, a := range c.RequestAttributes {
		if a == "xds.cluster_name" {
			f[a] = structpb.NewStringValue(cluster)
		}
	}
	return map[string]*structpb.Struct{attrKey: {Fields: f}}
}
