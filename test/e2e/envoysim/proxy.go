package envoysim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"
)

// Proxy is a running Envoy stand-in.
type Proxy struct {
	cfg Config
	// tracer plays Envoy's tracer when the config traces (tracing.go).
	tracer *tracer
	// retries are the retry resources in use per cluster (retries.go).
	retryUse retryCounters
	// grpc holds one connection per fusebox host; epClusters is the
	// fusebox cluster of each ext_proc filter (route role, attempt role).
	grpc       grpcClusters
	epClusters map[*ExtProcConfig]*grpcCluster
	transport  *http.Transport
	stats      Stats
	srv        *http.Server
	ln         net.Listener
	reqSeq     atomic.Uint64

	mu  sync.Mutex
	log []Entry
	// logged is closed, and replaced, as each entry is recorded
	// (WaitLogged).
	logged chan struct{}
	// timeouts: every message timeout (timeouts.go), never reset.
	timeouts []*TimeoutEvent
	active   map[string]*atomic.Int64

	attemptMu sync.Mutex
	attempts  []AttemptLog

	accessLog *accessLogger
	// obsOpen counts observer streams not over yet; obsByReq finds them
	// by request (observe.go).
	obsOpen  atomic.Int64
	obsMu    sync.Mutex
	obsByReq map[string]*obsStream
}

// New builds a proxy for cfg.
func New(cfg Config) (*Proxy, error) {
	if err := checkRuntime(cfg.Runtime); err != nil {
		return nil, err
	}
	if err := cfg.checkAttributes(); err != nil {
		return nil, err
	}
	if err := cfg.checkBodyModes(); err != nil {
		return nil, err
	}
	if cfg.AccessLog != nil {
		if err := checkFlagNames(cfg.AccessLog.Flags); err != nil {
			return nil, err
		}
	}
	if cfg.BufferLimit == 0 {
		cfg.BufferLimit = 1 << 20 // per_connection_buffer_limit_bytes' default
	}
	p := &Proxy{cfg: cfg, active: map[string]*atomic.Int64{}}
	if cfg.Tracing != nil {
		t, err := newTracer(*cfg.Tracing)
		if err != nil {
			return nil, err
		}
		p.tracer = t
	}
	p.stats.recordChunks = cfg.ChunkDelays
	for name := range cfg.Clusters {
		p.active[name] = &atomic.Int64{}
	}
	p.epClusters = map[*ExtProcConfig]*grpcCluster{}
	filters := []*ExtProcConfig{&p.cfg.ExtProc}
	if p.cfg.Observer != nil {
		filters = append(filters, p.cfg.Observer)
	}
	if p.cfg.Failover != nil {
		filters = append(filters, &p.cfg.Failover.Attempt)
	}
	for _, f := range filters {
		if f.Addr == "" {
			continue // no such filter
		}
		c, err := p.grpc.cluster(hosts(f.Addr, f.Addrs), p.cfg.streamWindow(f), p.cfg.Envoy.ConnWindowDefault())
		if err != nil {
			p.grpc.close()
			return nil, err
		}
		p.epClusters[f] = c
	}
	if cfg.AccessLog != nil {
		if len(hosts(cfg.AccessLog.Addr, cfg.AccessLog.Addrs)) == 0 {
			p.grpc.close()
			return nil, errors.New("envoysim: the access log names no host (set AccessLog.Addr)")
		}
		c, err := p.grpc.cluster(hosts(cfg.AccessLog.Addr, cfg.AccessLog.Addrs), cfg.Envoy.StreamWindowDefault(), cfg.Envoy.ConnWindowDefault())
		if err != nil {
			p.grpc.close()
			return nil, err
		}
		p.accessLog = newAccessLogger(*cfg.AccessLog, c)
	}
	p.transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		DisableCompression:  true,
	}
	return p, nil
}

// Start listens on addr ("127.0.0.1:0" for any port).
func (p *Proxy) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	p.ln = ln
	p.srv = &http.Server{Handler: p}
	go p.srv.Serve(ln)
	return nil
}

// URL is the proxy's base URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// CloseIdleConnections closes idle upstream keep-alive connections.
func (p *Proxy) CloseIdleConnections() { p.transport.CloseIdleConnections() }

// Close stops the proxy.
func (p *Proxy) Close() {
	if p.srv != nil {
		p.srv.Close()
	}
	if p.accessLog != nil {
		p.accessLog.close()
	}
	p.grpc.close()
	p.transport.CloseIdleConnections()
	if p.tracer != nil {
		p.tracer.close()
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() *Stats { return &p.stats }

// UpstreamActive is the cluster's upstream_rq_active gauge: requests
// holding one of its max_requests slots. Envoy writes a request's access
// log before it destroys the filters (the router frees the slot then), so
// a logged entry does not mean its slot is free yet; a test that needs the
// slot waits for this.
func (p *Proxy) UpstreamActive(cluster string) int64 {
	if a := p.active[cluster]; a != nil {
		return a.Load()
	}
	return 0
}

// Log returns a copy of the access log.
func (p *Proxy) Log() []Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Entry(nil), p.log...)
}

// ResetLog drops the access log (a long soak would otherwise keep every
// request's entry).
func (p *Proxy) ResetLog() {
	p.mu.Lock()
	p.log = nil
	p.mu.Unlock()
}

// record ends a request: its access log entry, kept and, with the
// http_grpc logger configured, sent to it.
func (p *Proxy) record(e *Entry) {
	if e.logged {
		return // written as the stream ended (cutEnd)
	}
	e.logged = true
	e.Duration = time.Since(e.Start)
	p.endTimeout(e)
	if e.Gateway == "" {
		e.Gateway = p.cfg.Gateway
	}
	p.mu.Lock()
	p.log = append(p.log, *e)
	if p.logged != nil {
		close(p.logged)
		p.logged = nil
	}
	p.mu.Unlock()
	if p.accessLog != nil {
		p.accessLog.log(e, e.Attempts)
	}
}

// route is the result of route matching.
type route struct {
	viaHeader bool
	cluster   string
}

// computeRoute matches the routes of the shipped config in order: (a)
// requests that carry the cluster header → cluster_header (its first
// value); (b) everything else → the first default route whose prefix the
// :path has, else the catch-all's cluster.
func (p *Proxy) computeRoute(h headers) route {
	if v, ok := h.get(p.cfg.ClusterHeader); ok {
		return route{viaHeader: true, cluster: v}
	}
	path, _ := h.get(":path")
	for _, r := range p.cfg.DefaultRoutes {
		if strings.HasPrefix(path, r.Prefix) {
			return route{cluster: r.Cluster}
		}
	}
	return route{cluster: p.cfg.DefaultCluster}
}

// response is what the router produced: an upstream's response or one of
// Envoy's local replies.
type response struct {
	status  int
	hdr     headers
	body    io.ReadCloser
	flags   uint64
	details string
	local   bool
	// gone: the client went away before any response (clientGone).
	gone bool
	// beforeRouter: a local reply the filter manager sent before the
	// router ran (the 413 of a body over the limit): no route entry
	// finalizes its headers.
	beforeRouter bool
	// trailer is the upstream's trailers, read once the body is at EOF
	// (nil: the response can have none).
	trailer func() http.Header
}

func localReply(status int, flags uint64, details, body string, extra ...kv) *response {
	h := headers{{"content-type", "text/plain"}, {"content-length", strconv.Itoa(len(body))}}
	h = append(h, extra...)
	return &response{status: status, hdr: h, body: io.NopCloser(strings.NewReader(body)), flags: flags, details: details, local: true}
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	entry := &Entry{Start: time.Now(), Method: r.Method, Path: r.URL.RequestURI(), Metadata: map[string]*structpb.Struct{}}
	defer p.record(entry)

	// The request as the connection manager hands it to the filters.
	h := headers{{":authority", r.Host}, {":path", r.URL.RequestURI()}, {":method", r.Method}, {":scheme", "http"}}
	for k, vs := range r.Header {
		for _, v := range vs {
			h.add(strings.ToLower(k), v)
		}
	}
	// The body is read up to the buffer limit here; what is past it is
	// read, or refused, after the request headers' phase (overLimit).
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(p.cfg.BufferLimit)+1))
	if err != nil {
		entry.Reset = true
		return
	}
	if r.ContentLength > 0 {
		h.set("content-length", strconv.FormatInt(r.ContentLength, 10))
	} else if r.ContentLength == 0 && len(body) > 0 {
		h.set("content-length", strconv.Itoa(len(body)))
	}
	entry.RequestID = fmt.Sprintf("req-%d", p.reqSeq.Add(1))
	h.set("x-request-id", entry.RequestID)
	w.Header().Set(RequestHeader, entry.RequestID)
	h.set("x-forwarded-proto", "http")

	// The connection manager strips the retry headers a client may not
	// set (an external request: conn_manager_utility.cc), so only a filter
	// can bound or widen retries.
	for _, k := range []string{"x-envoy-max-retries", "x-envoy-retry-on", "x-envoy-retry-grpc-on"} {
		h.del(k)
	}
	// HCM early_header_mutation: client fusebox headers go before routing.
	if p.cfg.StripPrefix != "" {
		h.delPrefix(p.cfg.StripPrefix)
	}
	// header_mutation looks up its per-route config: the route is computed
	// (and cached) now; then it sets the gateway for the virtual host.
	rt := p.computeRoute(h)
	if p.cfg.GatewayHeader != "" {
		h.set(p.cfg.GatewayHeader, p.cfg.Gateway)
	}
	for k, v := range p.cfg.VHostHeaders {
		h.set(k, v)
	}

	if p.tracer != nil {
		var sp trace.Span
		entry.traceCtx, sp = p.tracer.requestSpan(h, r.URL.Path)
		defer sp.End()
	}
	ep := newEPStream(p)
	ep.traceCtx = entry.traceCtx
	entry.routeEP = ep
	ep.entry = entry
	defer ep.close()

	// ext_proc: request headers.
	eos := len(body) == 0
	if ep.active() && headerMode(ep.modes.RequestHeaderMode, true) {
		req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: eos}}}
		cr, resp, stop := p.requestPhase(w, entry, ep, req, func(r *extprocv3.ProcessingResponse) (*extprocv3.CommonResponse, bool) {
			if x, ok := r.Response.(*extprocv3.ProcessingResponse_RequestHeaders); ok {
				return x.RequestHeaders.GetResponse(), true
			}
			return nil, false
		})
		if stop {
			return
		}
		if resp != nil {
			if !p.applyRequestReply(w, entry, &h, &rt, cr, resp) {
				return
			}
			if cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE {
				body = replacedBody(cr, body)
				ep.modes.RequestBodyMode = filterv3.ProcessingMode_NONE
			}
			if resp.ModeOverride != nil && p.cfg.ExtProc.AllowModeOverride {
				ep.modes = overrideModes(resp.ModeOverride, ep.c)
				if !p.playsOverride(w, entry, ep) {
					return
				}
			}
			p.afterRequestHeaders(ep, eos)
		}
	}

	if len(body) > p.cfg.BufferLimit {
		var ok bool
		if body, ok = p.overLimit(w, r, entry, ep, body); !ok {
			return
		}
	}

	// ext_proc: buffered request body (one message, end_of_stream set). In
	// BUFFERED mode Envoy has not routed yet, so the reply may re-route.
	if ep.active() && !eos && ep.modes.RequestBodyMode == filterv3.ProcessingMode_BUFFERED {
		req := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
		cr, resp, stop := p.requestPhase(w, entry, ep, req, func(r *extprocv3.ProcessingResponse) (*extprocv3.CommonResponse, bool) {
			if x, ok := r.Response.(*extprocv3.ProcessingResponse_RequestBody); ok {
				return x.RequestBody.GetResponse(), true
			}
			return nil, false
		})
		if stop {
			return
		}
		if resp != nil {
			if !p.applyRequestReply(w, entry, &h, &rt, cr, resp) {
				return
			}
			if nb, replaced := bodyMutation(cr, body); replaced {
				body = nb
				if cl, ok := h.get("content-length"); ok && cl != strconv.Itoa(len(body)) {
					p.writeLocal(w, entry, localReply(500, 0, "ext_proc_content_length_mismatch", "content-length does not match the replaced body"))
					return
				}
			}
		}
	}

	// Router.
	entry.Route, entry.Cluster = "default", rt.cluster
	if rt.viaHeader {
		entry.Route = "cluster_header"
	}
	ctx, cancel := context.WithCancel(r.Context())
	if p.cfg.RouteTimeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), p.cfg.RouteTimeout)
	}
	defer cancel()
	if p.cfg.Failover != nil && rt.viaHeader {
		p.failover(ctx, w, r, entry, &h, body)
		return
	}
	up := p.dispatch(ctx, rt.cluster, h, body)
	defer up.body.Close()
	entry.Flags, entry.Details = up.flags, up.details
	if up.gone {
		// The connection manager destroys the stream: the ext_proc stream
		// is reset without a response, and nothing is written.
		ep.reset()
		return
	}
	if up.local && p.cfg.Envoy.SkipsLocalReplies(p.cfg.Runtime) {
		// Envoy 1.34–1.36 (and the backports): onLocalReply marks
		// processing complete, so the server is sent nothing of the reply;
		// the stream closes (half-close, then reset), as on a client cancel.
		p.stats.add("local_reply_not_sent_to_ext_proc")
		ep.close()
		p.writeLocal(w, entry, up)
		return
	}

	p.respond(w, r, entry, ep, up)
}

var errSpurious = errors.New("spurious ext_proc message")

// requestPhase sends one request-path message and waits for its reply. It
// answers the client itself, and reports stop, when the processor sent an
// immediate response or failed without failure_mode_allow. resp is nil when
// processing stopped but the request continues unprocessed.
func (p *Proxy) requestPhase(w http.ResponseWriter, e *Entry, ep *epStream, req *extprocv3.ProcessingRequest,
	kind func(*extprocv3.ProcessingResponse) (*extprocv3.CommonResponse, bool)) (cr *extprocv3.CommonResponse, resp *extprocv3.ProcessingResponse, stop bool) {
	t0, marked := time.Now(), p.stats.inWindow()
	resp, err := ep.exchange(req)
	if ep.c == &p.cfg.ExtProc {
		p.stats.wait(time.Since(t0), marked)
	}
	if errors.Is(err, errAttemptReset) {
		return nil, nil, true // the caller handles the reset; nothing is written
	}
	if err != nil {
		if !ep.fail(err) {
			p.writeLocal(w, e, p.errorReply(err))
			return nil, nil, true
		}
		return nil, nil, false
	}
	if ir, ok := resp.Response.(*extprocv3.ProcessingResponse_ImmediateResponse); ok {
		p.writeImmediate(w, e, ep, ir.ImmediateResponse, resp)
		return nil, nil, true
	}
	if cr, ok := kind(resp); ok {
		return cr, resp, false
	}
	p.stats.add("spurious_msgs_received")
	if !ep.fail(errSpurious) {
		p.writeLocal(w, e, localReply(500, 0, "ext_proc_error_spurious", "spurious ext_proc message"))
		return nil, nil, true
	}
	return nil, nil, false
}

// applyRequestReply applies a request-path reply's header mutation, route
// cache clearing and metadata. Envoy has not routed yet during the request
// phase (the headers reply, a BUFFERED body reply), so clear_route_cache may
// re-route. It reports false when the request failed.
func (p *Proxy) applyRequestReply(w http.ResponseWriter, e *Entry, h *headers, rt *route, cr *extprocv3.CommonResponse, resp *extprocv3.ProcessingResponse) bool {
	if err := p.applyMutation(h, cr.GetHeaderMutation(), false); err != nil {
		p.writeLocal(w, e, localReply(500, 0, "ext_proc_error", "ext_proc header mutation failed"))
		return false
	}
	p.clearRouteCache(cr, h, rt, false)
	p.keepMetadata(e, &p.cfg.ExtProc, resp)
	return true
}

// clearRouteCache re-selects the route when the reply asks for it, carries
// a header_mutation (an empty one counts) and Envoy has not routed yet.
func (p *Proxy) clearRouteCache(cr *extprocv3.CommonResponse, h *headers, rt *route, routed bool) {
	if !cr.GetClearRouteCache() {
		return
	}
	if cr.GetHeaderMutation() == nil || routed {
		p.stats.add("clear_route_cache_ignored")
		return
	}
	*rt = p.computeRoute(*h)
}

// keepMetadata keeps the dynamic metadata of the receiving namespaces of
// the filter c that got the reply (the route role's, or an attempt role's
// in a cluster's upstream chain), as Filter::setDynamicMetadata does: a
// filter with none keeps nothing ("leave unset to disallow writing any
// received dynamic metadata"). An upstream filter writes into the
// downstream request's StreamInfo (UpstreamFilterManager::streamInfo,
// upstream_request.cc), so the access log line sees it. Merged into what
// the namespace holds (StreamInfoImpl::setDynamicMetadata): a later reply's
// fields replace the same fields, and add others.
func (p *Proxy) keepMetadata(e *Entry, c *ExtProcConfig, resp *extprocv3.ProcessingResponse) {
	md := resp.GetDynamicMetadata()
	if md == nil {
		return
	}
	for _, ns := range c.ReceivingNamespaces {
		v, ok := md.Fields[ns]
		if !ok || v.GetStructValue() == nil {
			continue
		}
		cur := e.Metadata[ns]
		if cur == nil {
			cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			e.Metadata[ns] = cur
		}
		for k, f := range v.GetStructValue().Fields {
			cur.Fields[k] = f
		}
	}
}

// overrideModes is the modes after a mode_override (ext_proc.cc
// effectiveModeOverride): a DEFAULT header mode in the override keeps the
// filter's configured mode, the body modes are always the override's.
// Before, a DEFAULT header mode replaced the configured one (and then
// read as SEND).
func overrideModes(o *filterv3.ProcessingMode, c *ExtProcConfig) modes {
	m := modes{RequestHeaderMode: c.RequestHeaderMode, ResponseHeaderMode: c.ResponseHeaderMode,
		RequestBodyMode: o.RequestBodyMode, ResponseBodyMode: o.ResponseBodyMode}
	if o.RequestHeaderMode != filterv3.ProcessingMode_DEFAULT {
		m.RequestHeaderMode = o.RequestHeaderMode
	}
	if o.ResponseHeaderMode != filterv3.ProcessingMode_DEFAULT {
		m.ResponseHeaderMode = o.ResponseHeaderMode
	}
	return m
}

func replacedBody(cr *extprocv3.CommonResponse, body []byte) []byte {
	if nb, ok := bodyMutation(cr, body); ok {
		return nb
	}
	return body
}

func bodyMutation(cr *extprocv3.CommonResponse, body []byte) ([]byte, bool) {
	bm := cr.GetBodyMutation()
	if bm == nil {
		return body, false
	}
	switch m := bm.Mutation.(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body, true
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil, true
		}
	}
	return body, false
}

// errorReply is status_on_error: 500, or 504 for a message timeout.
func (p *Proxy) errorReply(err error) *response {
	if errors.Is(err, errMessageTimeout) {
		return localReply(504, 0, "ext_proc_error_message_timeout", "ext_proc message timeout")
	}
	return localReply(500, 0, "ext_proc_error_grpc", "ext_proc error")
}

// writeImmediate sends the processor's local reply (status < 200 becomes
// 200); it does not go back through the processor.
func (p *Proxy) writeImmediate(w http.ResponseWriter, e *Entry, ep *epStream, ir *extprocv3.ImmediateResponse, resp *extprocv3.ProcessingResponse) {
	p.keepMetadata(e, ep.c, resp)
	status := int(ir.GetStatus().GetCode())
	if status < 200 {
		status = 200
	}
	var h headers
	if err := p.applyMutation(&h, ir.GetHeaders(), true); err != nil {
		p.writeLocal(w, e, localReply(500, 0, "ext_proc_error", "bad immediate response headers"))
		return
	}
	for _, x := range h {
		w.Header().Add(x.k, x.v)
	}
	w.Header().Set("content-length", strconv.Itoa(len(ir.Body)))
	p.observeImmediate(e, status, h, ir)
	w.WriteHeader(status)
	_, _ = w.Write(ir.Body)
	e.Status, e.Details = status, ir.Details
	ep.close()
}

// observeImmediate shows the processor's immediate response to the
// observer: Envoy sends it as a local reply through the encoder chain, and
// from 1.37 the observability-mode filter there sees local replies
// (docs/envoy.md, "local replies reach the response path again"), with
// the immediate response's details and no flag. 1.34–1.36 skip them.
func (p *Proxy) observeImmediate(e *Entry, status int, h headers, ir *extprocv3.ImmediateResponse) {
	if p.cfg.Envoy.SkipsLocalReplies(p.cfg.Runtime) {
		return
	}
	obs := p.newObserver(e, e.RequestID)
	if obs == nil {
		return
	}
	defer obs.close()
	oh := append(headers{{":status", strconv.Itoa(status)}}, h...)
	obs.headers(oh, len(ir.Body) == 0, &response{status: status, details: ir.Details})
	if len(ir.Body) > 0 {
		obs.body(ir.Body, true)
	}
}

// writeLocal sends one of Envoy's own replies straight to the client
// (errors of the ext_proc filter itself do not go back through it).
func (p *Proxy) writeLocal(w http.ResponseWriter, e *Entry, lr *response) {
	p.atEncodeHeaders(e.routeEP)
	for _, x := range lr.hdr {
		w.Header().Add(x.k, x.v)
	}
	w.WriteHeader(lr.status)
	_, _ = io.Copy(w, lr.body)
	e.Status, e.Flags, e.Details = lr.status, lr.flags, lr.details
}

// isConnectFailure tells a refused or failed connect from a reset.
func isConnectFailure(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

func (p *Proxy) retries(kind string) bool {
	for _, r := range p.cfg.RetryOn {
		if r == kind {
			return true
		}
	}
	return false
}

// dispatch sends the request to a cluster, with Envoy's retry policy and
// local replies.
func (p *Proxy) dispatch(ctx context.Context, cluster string, h headers, body []byte) *response {
	c, ok := p.cfg.Clusters[cluster]
	if !ok {
		p.stats.add("no_cluster")
		return localReply(503, flagNC, "cluster_not_found", "")
	}
	if c.Addr == "" {
		return localReply(503, flagUH, "no_healthy_upstream", "no healthy upstream")
	}
	max := c.MaxRequests
	if max == 0 {
		max = 1024
	}
	active := p.active[cluster]
	if active.Add(1) > int64(max) {
		active.Add(-1)
		p.stats.add("upstream_rq_pending_overflow")
		return localReply(503, flagUO, "upstream_reset_before_response_started{overflow}",
			"upstream connect error or disconnect/reset before headers. reset reason: overflow", kv{"x-envoy-overloaded", "true"})
	}
	// The request's retry state holds a slot of the cluster's retry
	// resource from each retry until the retried attempt's outcome, here
	// until the request's end (retries.go); a retry the resource refuses is
	// not made, and the failed attempt's answer goes to the client with UO
	// added (router.cc: a NoOverflow retry status sets UpstreamOverflow).
	slot := &retrySlot{p: p, cluster: cluster}
	release := sync.OnceFunc(func() {
		active.Add(-1)
		slot.reset()
	})

	var lastErr error
	var flags uint64
	numRetries := maxRetries(&h, p.cfg.NumRetries, len(p.cfg.RetryOn) > 0)
	for attempt := 0; attempt <= numRetries; attempt++ {
		if attempt > 0 {
			if !slot.take() {
				flags |= flagUO
				break
			}
			if !slot.backoff(ctx) {
				break
			}
			p.stats.add("upstream_rq_retry")
			flags |= flagURX
		}
		ictx, idle := p.watchIdle(ctx)
		req, err := p.upstreamRequest(ictx, c, h, body, p.cfg.RequestHeadersToRemove)
		if err != nil {
			idle.done()
			release()
			return localReply(500, 0, "bad_request", err.Error())
		}
		resp, err := p.transport.RoundTrip(req)
		if err == nil {
			idle.touch()
			done := func() { idle.done(); release() }
			return &response{status: resp.StatusCode, hdr: upstreamHeaders(resp), body: &releaseBody{ReadCloser: &idleBody{ReadCloser: &cxBody{ReadCloser: resp.Body, ctx: ictx, p: p, cluster: cluster}, ctx: ictx, w: idle}, release: done}, details: "via_upstream",
				trailer: func() http.Header { return resp.Trailer }}
		}
		idle.done()
		lastErr = err
		if errors.Is(context.Cause(ictx), errStreamIdle) {
			// The connection manager's timer, not the router's: no retry.
			release()
			p.stats.add("downstream_rq_idle_timeout")
			return localReply(504, flagSI, "stream_idle_timeout", "stream timeout")
		}
		if ctx.Err() != nil {
			break
		}
		kind := "reset"
		if isConnectFailure(err) {
			kind = "connect-failure"
			p.connectFailed(cluster)
		}
		p.lostBeforeHeaders(ctx, cluster, err)
		if !p.retries(kind) {
			break
		}
	}
	release()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		p.stats.add("upstream_rq_timeout")
		return localReply(504, flagUT, "upstream_response_timeout", "upstream request timeout")
	}
	if ctx.Err() != nil {
		return clientGone()
	}
	if isConnectFailure(lastErr) {
		return localReply(503, flags|flagUF, "upstream_reset_before_response_started{remote_connection_failure}",
			"upstream connect error or disconnect/reset before headers. reset reason: connection failure")
	}
	return localReply(503, flags|flagUC, "upstream_reset_before_response_started{connection_termination}",
		"upstream connect error or disconnect/reset before headers. reset reason: connection termination")
}

// upstreamHeaders are a provider's response headers as Envoy keeps them:
// lower-case keys, content-length when known.
func upstreamHeaders(resp *http.Response) headers {
	hdr := headers{}
	for k, vs := range resp.Header {
		for _, v := range vs {
			hdr.add(strings.ToLower(k), v)
		}
	}
	if resp.ContentLength >= 0 {
		hdr.set("content-length", strconv.FormatInt(resp.ContentLength, 10))
	}
	return hdr
}

type releaseBody struct {
	io.ReadCloser
	release func()
}

func (b *releaseBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// upstreamRequest builds the request a cluster receives: the route's
// request_headers_to_remove (remove) applied, the Host rewritten to the
// cluster's address (auto_host_rewrite).
func (p *Proxy) upstreamRequest(ctx context.Context, c *Cluster, h headers, body []byte, remove []string) (*http.Request, error) {
	method, _ := h.get(":method")
	path, _ := h.get(":path")
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.Addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.ContentLength = int64(len(body))
	for _, x := range h {
		if strings.HasPrefix(x.k, ":") || x.k == "host" || x.k == "content-length" {
			continue
		}
		drop := false
		for _, r := range remove {
			if x.k == r {
				drop = true
			}
		}
		if !drop {
			req.Header.Add(x.k, x.v)
		}
	}
	req.Host = c.Addr
	return req, nil
}

// Response flag bits (docs/ext_proc.md, Attributes).
const (
	flagUH    = 0x2
	flagUT    = 0x4
	flagLR    = 0x8
	flagUR    = 0x10
	flagUF    = 0x20
	flagUC    = 0x40
	flagUO    = 0x80
	flagNR    = 0x100
	flagDC    = 0x4000
	flagURX   = 0x8000
	flagSI    = 0x10000
	flagUMSDR = 0x80000
	flagDT    = 0x400000
	flagUPE   = 0x800000
	flagNC    = 0x1000000
	flagDR    = 0x10000000
)

// connectFailed counts an attempt whose connection failed as Envoy's
// connection pool does (docs/envoy.md, "Connection failures"):
// upstream_cx_connect_fail per connection that failed while connecting,
// upstream_rq_pending_failure_eject per request that failure failed. Each
// envoysim attempt dials its own connection, so both count it once; in
// Envoy one failed connection fails every request pending on it, so the
// second is the one that counts attempts (the soak bounds fusebox's
// connection errors by it).
func (p *Proxy) connectFailed(cluster string) {
	for _, stat := range []string{"upstream_cx_connect_fail", "upstream_rq_pending_failure_eject"} {
		p.stats.add(stat)
		p.stats.add("cluster." + cluster + "." + stat)
	}
}
