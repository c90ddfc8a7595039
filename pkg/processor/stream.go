package processor

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/processor/classify"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// stream is the state of one route-role ext_proc stream, i.e. one HTTP
// request. It is used by one goroutine.
type stream struct {
	s    *Server
	rt   *routes.Runtime
	comp *compiled
	gw   *routes.Gateway

	reqBodyMode  filterv3.ProcessingMode_BodySendMode
	respBodyMode filterv3.ProcessingMode_BodySendMode

	startNs int64 // request headers received (coarse clock)

	// Request side.
	seenReqHeaders bool
	reqEOS         bool // the request had no body
	contentType    string
	modelName      string // from the header, or the body
	residency      []string
	awaitingBody   bool // the decision waits for the buffered body
	rewriteBody    bool // the chosen route needs the body's model rewritten
	clientCluster  bool // the request carried our cluster header

	// The decision.
	model   *routes.Model
	chosen  *routes.Route
	target  *breaker.Target
	adm     breaker.TargetAdmission
	tracked bool // outcomes of this attempt are recorded
	first   *routes.Route

	// Response side.
	respStarted bool
	recorded    bool
	verdict     headVerdict
	pending     breaker.Result
	sniff       []byte
	classifier  *classify.Classifier
}

func newStream(s *Server) *stream {
	return &stream{s: s, respBodyMode: filterv3.ProcessingMode_STREAMED, reqBodyMode: filterv3.ProcessingMode_BUFFERED}
}

func (st *stream) now() int64 { return st.s.clock.Now().UnixNano() }

func (st *stream) handle(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if pc := req.ProtocolConfig; pc != nil {
		st.reqBodyMode, st.respBodyMode = pc.RequestBodyMode, pc.ResponseBodyMode
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.seenReqHeaders {
			return st.spurious(req)
		}
		st.seenReqHeaders = true
		return st.onRequestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if st.respStarted {
			return st.spurious(req)
		}
		return st.onResponseHeaders(r.ResponseHeaders, req)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.onResponseEnd()
		return continueReply(req)
	}
	// Request trailers and anything else: the reply of the matching kind.
	return continueReply(req)
}

// spurious answers a duplicate message with the reply of its kind and
// changes nothing.
func (st *stream) spurious(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	st.s.log.Warn("duplicate ext_proc message ignored", "phase", phaseOf(req))
	return continueReply(req)
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
				HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(st.rt.Headers.Cluster, r.Cluster), setHeader(st.rt.Headers.Route, r.Key)}},
				ClearRouteCache: true,
			}
			if _, ok := req.Request.(*extprocv3.ProcessingRequest_RequestHeaders); ok {
				return headersReply(cr)
			}
			return bodyReply(cr)
		}
	}
	return continueReply(req)
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
		if f, err := scanModel(b.Body); err == nil && f.Found {
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

func (st *stream) onRequestHeaders(h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	st.startNs = st.now()
	st.rt = st.s.cfg.Load()
	st.comp = st.s.compiledFor(st.rt)
	hn := st.rt.Headers
	var gateway, residency string
	if h.Headers != nil {
		for _, hv := range h.Headers.Headers {
			switch hv.Key {
			case hn.Gateway:
				gateway = headerValue(hv)
			case hn.Model:
				st.modelName = strings.TrimSpace(headerValue(hv))
			case hn.Residency:
				residency = headerValue(hv)
			case hn.Cluster:
				st.clientCluster = true
			case "content-type":
				st.contentType = headerValue(hv)
			}
		}
	}
	st.reqEOS = h.EndOfStream
	st.residency = routes.ParseResidency(residency)
	gw, ok := st.rt.Gateway(gateway)
	if !ok {
		st.s.metrics.Decisions.WithLabelValues("", "", routes.ActionRejected).Inc()
		return immediate(404, typeInvalidRequest, codeGatewayUnknown, fmt.Sprintf("gateway %q is not configured", gateway))
	}
	st.gw = gw
	if st.modelName != "" {
		// R-D5: the header wins; decide now.
		d := st.decide()
		if d.immediate != nil {
			return d.immediate
		}
		cr := st.dispatchMutation(d)
		resp := headersReply(cr)
		resp.DynamicMetadata = d.stage
		if st.chosen.UpstreamModel != "" && !st.reqEOS {
			st.rewriteBody = true // the buffered body comes next
		} else if !st.reqEOS {
			resp.ModeOverride = modeOverride(filterv3.ProcessingMode_NONE, st.respBodyMode)
		}
		return resp
	}
	if st.reqEOS {
		return st.passthroughHeaders()
	}
	if st.contentType != "" && !isJSONContentType(st.contentType) {
		// Multipart audio and the like: no model to read, and no reason
		// to have Envoy buffer it.
		resp := st.passthroughHeaders()
		resp.ModeOverride = modeOverride(filterv3.ProcessingMode_NONE, st.respBodyMode)
		return resp
	}
	st.awaitingBody = true
	return headersReply(nil)
}

// passthroughHeaders lets a request with no model go to Envoy's default
// route. A client-sent cluster header is removed even though the shipped
// Envoy config strips it first: a client never chooses the cluster.
func (st *stream) passthroughHeaders() *extprocv3.ProcessingResponse {
	st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", routes.ActionPassthrough).Inc()
	if st.clientCluster {
		return headersReply(st.removeClusterHeader())
	}
	return headersReply(nil)
}

func (st *stream) removeClusterHeader() *extprocv3.CommonResponse {
	hn := st.rt.Headers
	return &extprocv3.CommonResponse{
		HeaderMutation:  &extprocv3.HeaderMutation{RemoveHeaders: []string{hn.Cluster, hn.Route, hn.Fallbacks}},
		ClearRouteCache: true,
	}
}

// bodyComplete reports whether a request body message holds the whole body.
func (st *stream) bodyComplete(b *extprocv3.HttpBody) bool {
	switch st.reqBodyMode {
	case filterv3.ProcessingMode_BUFFERED:
		return true // end_of_stream is false only when trailers follow
	case filterv3.ProcessingMode_BUFFERED_PARTIAL:
		return b.EndOfStream
	}
	return false
}

func (st *stream) onRequestBody(b *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	switch {
	case st.rewriteBody && st.bodyComplete(b):
		st.rewriteBody = false
		f, err := scanModel(b.Body)
		if err != nil || !f.Found {
			return bodyReply(nil) // nothing to rewrite; the route was already chosen
		}
		return bodyReply(st.bodyRewrite(b.Body, f, &extprocv3.CommonResponse{}))
	case !st.awaitingBody || st.respStarted || st.gw == nil:
		return bodyReply(nil)
	}
	st.awaitingBody = false
	if !st.bodyComplete(b) {
		// A streamed request body cannot be read whole; let it through.
		st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", routes.ActionPassthrough).Inc()
		return bodyReply(nil)
	}
	f, err := scanModel(b.Body)
	declaredJSON := isJSONContentType(st.contentType)
	switch {
	case err != nil && (declaredJSON || errors.Is(err, errModelNotStr)):
		st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", routes.ActionRejected).Inc()
		return immediate(400, typeInvalidRequest, codeInvalid, "invalid JSON body: "+err.Error())
	case err != nil || !f.Found:
		st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", routes.ActionPassthrough).Inc()
		if st.clientCluster {
			return bodyReply(st.removeClusterHeader())
		}
		return bodyReply(nil)
	}
	st.modelName = f.Name
	d := st.decide()
	if d.immediate != nil {
		return d.immediate
	}
	cr := st.dispatchMutation(d)
	if st.chosen.UpstreamModel != "" {
		cr = st.bodyRewrite(b.Body, f, cr)
	}
	resp := bodyReply(cr)
	resp.DynamicMetadata = d.stage
	return resp
}

// bodyRewrite replaces the model with the route's upstream_model and sets
// content-length to the new length (Envoy fails a replaced body whose length
// differs from a content-length left on the headers).
func (st *stream) bodyRewrite(body []byte, f modelField, cr *extprocv3.CommonResponse) *extprocv3.CommonResponse {
	nb := rewriteModel(body, f, st.chosen.UpstreamModel)
	if cr.HeaderMutation == nil {
		cr.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	cr.HeaderMutation.SetHeaders = append(cr.HeaderMutation.SetHeaders, setHeader("content-length", strconv.Itoa(len(nb))))
	cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: nb}}
	return cr
}

// dispatchMutation builds the R-D3 mutation: cluster, route and fallbacks
// headers, :path when the route has one, and clear_route_cache in the same
// reply as the header_mutation (ENVOY.md).
func (st *stream) dispatchMutation(d decision) *extprocv3.CommonResponse {
	hn := st.rt.Headers
	set := []*corev3.HeaderValueOption{
		setHeader(hn.Cluster, st.chosen.Cluster),
		setHeader(hn.Route, st.chosen.Key),
	}
	var remove []string
	if d.fallbacks != "" {
		set = append(set, setHeader(hn.Fallbacks, d.fallbacks))
	} else {
		remove = append(remove, hn.Fallbacks)
	}
	if st.chosen.Path != "" {
		set = append(set, setHeader(":path", st.chosen.Path))
	}
	return &extprocv3.CommonResponse{
		HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
		ClearRouteCache: true,
	}
}
