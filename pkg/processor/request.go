package processor

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/plan"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// The request phase: read the gateway, model and residency; decide at the
// headers when the model header is present (R-D5), otherwise at the
// buffered body; pass through what names no model (R-D4).

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
				gateway = extproc.HeaderValue(hv)
			case hn.Model:
				st.modelName = strings.TrimSpace(extproc.HeaderValue(hv))
			case hn.Residency:
				residency = extproc.HeaderValue(hv)
			case hn.Cluster:
				st.clientCluster = true
			case "content-type":
				st.contentType = extproc.HeaderValue(hv)
			case ":path":
				st.path = extproc.HeaderValue(hv)
			case "x-stainless-retry-count":
				// The official SDKs' retry count (R-FD4): a retry of a
				// request that failed.
				n, err := strconv.Atoi(strings.TrimSpace(extproc.HeaderValue(hv)))
				st.retried = err == nil && n > 0
			case "idempotency-key", "x-idempotency-key":
				// Hashed at once: a header value is never kept.
				st.idem, st.hasIdem = sha256.Sum256([]byte(extproc.HeaderValue(hv))), true
			}
		}
	}
	st.reqEOS = h.EndOfStream
	st.residency = routes.ParseResidency(residency)
	gw, ok := st.rt.Gateway(gateway)
	if !ok {
		st.s.metrics.Decisions.WithLabelValues("", "", plan.ActionRejected).Inc()
		return st.errorReply(404, extproc.TypeInvalidRequest, extproc.CodeGatewayUnknown, fmt.Sprintf("gateway %q is not configured", extproc.EchoName(gateway)))
	}
	st.gw = gw
	if st.modelName != "" {
		// R-D5: the header wins; decide now.
		d := st.decide()
		if d.immediate != nil {
			return d.immediate
		}
		cr := st.dispatchMutation(d)
		resp := extproc.HeadersReply(cr)
		resp.DynamicMetadata = d.stage
		if st.chosen.UpstreamModel != "" && !st.reqEOS {
			st.rewriteBody = true // the buffered body comes next
		} else if !st.reqEOS {
			resp.ModeOverride = st.modeOverride(filterv3.ProcessingMode_NONE)
		}
		return resp
	}
	if st.reqEOS {
		return st.passthroughHeaders()
	}
	if st.contentType != "" && !extproc.IsJSONContentType(st.contentType) {
		// Multipart audio and the like: no model to read, and no reason
		// to have Envoy buffer it.
		resp := st.passthroughHeaders()
		resp.ModeOverride = st.modeOverride(filterv3.ProcessingMode_NONE)
		return resp
	}
	st.awaitingBody = true
	return extproc.HeadersReply(nil)
}

// passthroughHeaders lets a request with no model go to Envoy's default
// route. A client-sent cluster header is removed even though the shipped
// Envoy config strips it first: a client never chooses the cluster.
func (st *stream) passthroughHeaders() *extprocv3.ProcessingResponse {
	st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", plan.ActionPassthrough).Inc()
	if st.clientCluster {
		return extproc.HeadersReply(st.removeClusterHeader())
	}
	return extproc.HeadersReply(nil)
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
		f, err := extproc.ScanModel(b.Body)
		if err != nil || !f.Found {
			return extproc.BodyReply(nil) // nothing to rewrite; the route was already chosen
		}
		return extproc.BodyReply(st.bodyRewrite(b.Body, f, &extprocv3.CommonResponse{}))
	case !st.awaitingBody || st.respStarted || st.gw == nil:
		return extproc.BodyReply(nil)
	}
	st.awaitingBody = false
	if !st.bodyComplete(b) {
		// A streamed request body cannot be read whole; let it through.
		st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", plan.ActionPassthrough).Inc()
		return extproc.BodyReply(nil)
	}
	f, err := extproc.ScanModel(b.Body)
	declaredJSON := extproc.IsJSONContentType(st.contentType)
	switch {
	case err != nil && (declaredJSON || errors.Is(err, extproc.ErrModelNotStr) || errors.Is(err, extproc.ErrModelTwice)):
		st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", plan.ActionRejected).Inc()
		return st.errorReply(400, extproc.TypeInvalidRequest, extproc.CodeInvalid, "invalid JSON body: "+err.Error())
	case err != nil || !f.Found:
		st.s.metrics.Decisions.WithLabelValues(st.gw.ID, "", plan.ActionPassthrough).Inc()
		if st.clientCluster {
			return extproc.BodyReply(st.removeClusterHeader())
		}
		return extproc.BodyReply(nil)
	}
	st.modelName = f.Name
	st.reqBody = b.Body // the fingerprint's (decide); not kept past it
	d := st.decide()
	st.reqBody = nil
	if d.immediate != nil {
		return d.immediate
	}
	cr := st.dispatchMutation(d)
	if st.chosen.UpstreamModel != "" {
		cr = st.bodyRewrite(b.Body, f, cr)
	}
	resp := extproc.BodyReply(cr)
	resp.DynamicMetadata = d.stage
	return resp
}
