package processor

import (
	"strconv"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The dispatch reply: the R-D3 mutation and the body rewrite.

// bodyRewrite replaces the model with the route's upstream_model and sets
// content-length to the new length (Envoy fails a replaced body whose length
// differs from a content-length left on the headers).
func (st *stream) bodyRewrite(body []byte, f extproc.ModelField, cr *extprocv3.CommonResponse) *extprocv3.CommonResponse {
	nb := extproc.RewriteModel(body, f, st.chosen.UpstreamModel)
	if cr.HeaderMutation == nil {
		cr.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	cr.HeaderMutation.SetHeaders = append(cr.HeaderMutation.SetHeaders, extproc.SetHeader("content-length", strconv.Itoa(len(nb))))
	cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: nb}}
	return cr
}

// dispatchMutation builds the R-D3 mutation: cluster, route and fallbacks
// headers, :path when the route has one, and clear_route_cache in the same
// reply as the header_mutation (docs/ext_proc.md).
// maxRetriesHeader bounds the router's retries of one request.
const maxRetriesHeader = "x-envoy-max-retries"

func (st *stream) dispatchMutation(d decision) *extprocv3.CommonResponse {
	hn := st.rt.Headers
	set := []*corev3.HeaderValueOption{
		extproc.SetHeader(hn.Cluster, st.chosen.Cluster),
		extproc.SetHeader(hn.Route, st.chosen.Key),
	}
	var remove []string
	if d.fallbacks != "" {
		set = append(set, extproc.SetHeader(hn.Fallbacks, d.fallbacks))
	} else {
		remove = append(remove, hn.Fallbacks)
	}
	if st.chosen.Path != "" {
		set = append(set, extproc.SetHeader(":path", st.chosen.Path))
	}
	if d.attempt != "" {
		// R-X6: the router reads x-envoy-max-retries when it builds the
		// request's retry state, after this reply, and it takes precedence
		// over the route's num_retries (retry_state_impl.cc); without it a
		// chain of 3, or of 1, made num_retries+1 = 10 attempts, repeating
		// the last route. Envoy strips the header from clients and takes
		// it from a filter only with mutation_rules.allow_envoy.
		set = append(set, extproc.SetHeader(AttemptHeader, d.attempt), extproc.SetHeader(maxRetriesHeader, strconv.Itoa(d.retries)))
	}
	return &extprocv3.CommonResponse{
		HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove},
		ClearRouteCache: true,
	}
}
