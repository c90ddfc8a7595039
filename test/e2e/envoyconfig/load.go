package envoyconfig

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	tracev3 "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	grpcalsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	credentialv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	prioritygroupv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/router/cluster_specifiers/priority_group/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"
)

// Load parses an Envoy bootstrap YAML file strictly (a misspelt field is
// "unknown field"; an unregistered @type fails) and validates it.
func Load(path string) (*bootstrapv3.Bootstrap, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(raw)
}

// Parse is Load on bytes.
func Parse(raw []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	return b, nil
}

// Harness derives the Envoy-playing proxy's settings from the bootstrap's
// first listener. Addresses (fusebox's, the clusters') are left for the
// caller, who runs everything on loopback.
func Harness(b *bootstrapv3.Bootstrap) (envoysim.Config, error) {
	var cfg envoysim.Config
	ls := b.GetStaticResources().GetListeners()
	if len(ls) == 0 {
		return cfg, fmt.Errorf("no listener")
	}
	l := ls[0]
	if v := l.GetPerConnectionBufferLimitBytes(); v != nil {
		cfg.BufferLimit = int(v.GetValue())
	}
	var hcm hcmv3.HttpConnectionManager
	found := false
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetTypedConfig().MessageIs(&hcm) {
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					return cfg, err
				}
				found = true
			}
		}
	}
	if !found {
		return cfg, fmt.Errorf("no http_connection_manager")
	}
	if v := hcm.GetMaxRequestHeadersKb(); v != nil {
		cfg.MaxRequestHeadersKb = int(v.GetValue())
	}
	if v := hcm.GetCommonHttpProtocolOptions().GetMaxHeadersCount(); v != nil {
		cfg.MaxHeadersCount = int(v.GetValue())
	}
	for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
		var em earlyv3.HeaderMutation
		if err := ext.GetTypedConfig().UnmarshalTo(&em); err != nil {
			return cfg, err
		}
		for _, m := range em.GetMutations() {
			if p := m.GetRemoveOnMatch().GetKeyMatcher().GetPrefix(); p != "" {
				cfg.StripPrefix = p
			}
		}
	}
	for _, al := range hcm.GetAccessLog() {
		var g grpcalsv3.HttpGrpcAccessLogConfig
		if !al.GetTypedConfig().MessageIs(&g) {
			continue
		}
		if err := al.GetTypedConfig().UnmarshalTo(&g); err != nil {
			return cfg, err
		}
		c := g.GetCommonConfig()
		if c.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "fusebox" {
			return cfg, fmt.Errorf("the http_grpc access log must go to the fusebox cluster")
		}
		if fl := al.GetFilter(); fl != nil && fl.GetResponseFlagFilter() == nil {
			// Fail closed: a filter envoysim does not play would pass
			// every entry in a test and not in Envoy.
			return cfg, fmt.Errorf("the http_grpc access log filter %T is not played by envoysim (only response_flag_filter)", fl.GetFilterSpecifier())
		}
		cfg.AccessLog = &envoysim.AccessLogConfig{LogName: c.GetLogName(), Flags: al.GetFilter().GetResponseFlagFilter().GetFlags(),
			FlagFilter: al.GetFilter().GetResponseFlagFilter() != nil}
		// Envoy's default buffer is 16 KiB, flushed every second.
		cfg.AccessLog.BufferSizeBytes = 16 << 10
		if v := c.GetBufferSizeBytes(); v != nil {
			cfg.AccessLog.BufferSizeBytes = int(v.GetValue())
		}
	}
	for _, layer := range b.GetLayeredRuntime().GetLayers() {
		for k, v := range layer.GetStaticLayer().GetFields() {
			if cfg.Runtime == nil {
				cfg.Runtime = map[string]string{}
			}
			switch x := v.Kind.(type) {
			case *structpb.Value_BoolValue:
				cfg.Runtime[k] = fmt.Sprint(x.BoolValue)
			case *structpb.Value_StringValue:
				cfg.Runtime[k] = x.StringValue
			case *structpb.Value_NumberValue:
				cfg.Runtime[k] = fmt.Sprint(x.NumberValue)
			}
		}
	}
	if tr := hcm.GetTracing(); tr.GetProvider() != nil {
		var otel tracev3.OpenTelemetryConfig
		if !tr.GetProvider().GetTypedConfig().MessageIs(&otel) {
			// Fail closed: a tracer envoysim does not play would send
			// other headers in Envoy than in the tests.
			return cfg, fmt.Errorf("the tracer %s is not played by envoysim (only envoy.tracers.opentelemetry)", tr.GetProvider().GetName())
		}
		if err := tr.GetProvider().GetTypedConfig().UnmarshalTo(&otel); err != nil {
			return cfg, err
		}
		cfg.Tracing = &envoysim.TracingConfig{Cluster: otel.GetGrpcService().GetEnvoyGrpc().GetClusterName(), ServiceName: otel.GetServiceName(), RandomSampling: 100}
		if rs := tr.GetRandomSampling(); rs != nil {
			cfg.Tracing.RandomSampling = rs.GetValue()
		}
	}
	obsCluster, epCluster := "", ""
	suppressEnvoyHeaders := false
	for _, f := range hcm.GetHttpFilters() {
		var rf routerv3.Router
		if f.GetTypedConfig().MessageIs(&rf) {
			if err := f.GetTypedConfig().UnmarshalTo(&rf); err != nil {
				return cfg, err
			}
			suppressEnvoyHeaders = rf.GetSuppressEnvoyHeaders()
		}
		var ep extprocv3.ExternalProcessor
		if f.GetTypedConfig().MessageIs(&ep) {
			if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
				return cfg, err
			}
			if ep.GetObservabilityMode() {
				// The observer profile's second filter (envoy-observer.yaml).
				o := extProcConfig(&ep)
				cfg.Observer = &o
				obsCluster = ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
				continue
			}
			cfg.ExtProc = extProcConfig(&ep)
			epCluster = ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		}
	}
	vhs := hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) == 0 {
		return cfg, fmt.Errorf("no virtual host")
	}
	vh := vhs[0]
	for _, h := range vh.GetResponseHeadersToAdd() {
		cfg.ResponseHeadersToAdd = append(cfg.ResponseHeadersToAdd, envoysim.HeaderToAdd{Key: h.GetHeader().GetKey(), Value: h.GetHeader().GetValue()})
	}
	if any, ok := vh.GetTypedPerFilterConfig()["envoy.filters.http.header_mutation"]; ok {
		var pr headermutationv3.HeaderMutationPerRoute
		if err := any.UnmarshalTo(&pr); err != nil {
			return cfg, err
		}
		for _, m := range pr.GetMutations().GetRequestMutations() {
			if h := m.GetAppend().GetHeader(); h != nil {
				cfg.GatewayHeader, cfg.Gateway = h.GetKey(), h.GetValue()
			}
		}
	}
	settingsFrom, timeoutsFrom := "", ""
	for i, r := range vh.GetRoutes() {
		ra := r.GetRoute()
		name := r.GetName()
		if name == "" {
			name = fmt.Sprintf("#%d (%s)", i+1, r.GetMatch().GetPrefix())
		}
		if ra.GetInlineClusterSpecifierPlugin() != nil {
			if err := failoverHarness(&cfg, b, vh, r); err != nil {
				return cfg, err
			}
			rc := cfg // the failover route's retry policy is its own (cfg.Failover)
			rc.RouteTimeout = ra.GetTimeout().AsDuration()
			rc.StreamIdleTimeout = streamIdle(ra.GetIdleTimeout(), hcm.GetStreamIdleTimeout())
			if err := oneTimeout(&cfg, &rc, name, &timeoutsFrom); err != nil {
				return cfg, err
			}
			continue
		}
		if ch := ra.GetClusterHeader(); ch != "" {
			cfg.ClusterHeader = ch
			if hs := r.GetMatch().GetHeaders(); len(hs) != 1 || hs[0].GetName() != ch || !hs[0].GetPresentMatch() {
				return cfg, fmt.Errorf("route with cluster_header %s must match on its presence", ch)
			}
		} else if c := ra.GetCluster(); c != "" {
			if pf := r.GetMatch().GetPrefix(); pf != "/" {
				cfg.DefaultRoutes = append(cfg.DefaultRoutes, envoysim.PrefixRoute{Prefix: pf, Cluster: c})
			} else {
				cfg.DefaultCluster = c
			}
		}
		var rc envoysim.Config
		rc.RequestHeadersToRemove = r.GetRequestHeadersToRemove()
		rc.RouteTimeout = ra.GetTimeout().AsDuration()
		rc.StreamIdleTimeout = streamIdle(ra.GetIdleTimeout(), hcm.GetStreamIdleTimeout())
		retry(&rc, ra.GetRetryPolicy())
		if err := oneRouteSettings(&cfg, &rc, name, &settingsFrom, &timeoutsFrom); err != nil {
			return cfg, err
		}
	}
	cfg.Clusters = map[string]*envoysim.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		cl := &envoysim.Cluster{}
		for _, t := range c.GetCircuitBreakers().GetThresholds() {
			if t.GetMaxRequests() != nil {
				cl.MaxRequests = int(t.GetMaxRequests().GetValue())
			}
			if t.GetMaxRetries() != nil {
				cl.MaxRetries = int(t.GetMaxRetries().GetValue())
				if cl.MaxRetries == 0 {
					cl.MaxRetries = envoysim.NoRetries
				}
			}
			if rb := t.GetRetryBudget(); rb != nil {
				// Envoy's defaults: 20 % and 3.
				b := &envoysim.RetryBudget{Percent: 20, MinConcurrency: 3}
				if rb.GetBudgetPercent() != nil {
					b.Percent = rb.GetBudgetPercent().GetValue()
				}
				if rb.GetMinRetryConcurrency() != nil {
					b.MinConcurrency = int(rb.GetMinRetryConcurrency().GetValue())
				}
				cl.RetryBudget = b
			}
		}
		cfg.Clusters[c.GetName()] = cl
	}
	if cfg.Failover != nil {
		cfg.Failover.SuppressEnvoyHeaders = suppressEnvoyHeaders
	}
	// Each filter's cluster's window: envoysim opens its connections to
	// fusebox with it, as Envoy's codec does (docs/envoy.md, "No PING
	// without connection_keepalive"), and the observer's is its buffer.
	if epCluster != "" {
		w, err := streamWindow(b, epCluster)
		if err != nil {
			return cfg, err
		}
		cfg.ExtProc.StreamWindow = w
	}
	if cfg.Observer != nil {
		w, err := streamWindow(b, obsCluster)
		if err != nil {
			return cfg, err
		}
		cfg.Observer.StreamWindow = w
	}
	return cfg, nil
}

// streamIdle is a route's stream idle timeout as envoysim takes it: the
// route's idle_timeout, else the connection manager's stream_idle_timeout,
// else 0 (Envoy's default); a 0s in the file turns it off (negative).
func streamIdle(route, hcm *durationpb.Duration) time.Duration {
	d := route
	if d == nil {
		d = hcm
	}
	if d == nil {
		return 0
	}
	if d.AsDuration() == 0 {
		return -1
	}
	return d.AsDuration()
}

// streamWindow is the named cluster's HTTP/2 initial_stream_window_size, 0
// when the file leaves Envoy's default.
func streamWindow(b *bootstrapv3.Bootstrap, cluster string) (int, error) {
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if !ok {
			return 0, nil
		}
		var hpo upstreamhttpv3.HttpProtocolOptions
		if err := opts.UnmarshalTo(&hpo); err != nil {
			return 0, err
		}
		return int(hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions().GetInitialStreamWindowSize().GetValue()), nil
	}
	return 0, fmt.Errorf("no %s cluster", cluster)
}

func retry(cfg *envoysim.Config, rp *routev3.RetryPolicy) {
	if rp == nil {
		return
	}
	cfg.RetryOn = strings.Split(rp.GetRetryOn(), ",")
	cfg.RetryBackOff = envoysim.BackOff{Base: rp.GetRetryBackOff().GetBaseInterval().AsDuration(), Max: rp.GetRetryBackOff().GetMaxInterval().AsDuration()}
	cfg.NumRetries = 1
	if n := rp.GetNumRetries(); n != nil {
		cfg.NumRetries = int(n.GetValue())
	}
}

// failoverHarness reads the failover deployment (envoy-failover.yaml) into
// cfg.Failover: route (a)'s priority_group specifier and retry policy, the
// virtual host's attempt count, and the provider clusters' upstream chains
// (attempt-role ext_proc, the header_mutation after it, the credential).
// Credentials are SDS secrets here; the harness stands each one in with
// "secret-<cluster>" in the header the injector writes.
func failoverHarness(cfg *envoysim.Config, b *bootstrapv3.Bootstrap, vh *routev3.VirtualHost, r *routev3.Route) error {
	ra := r.GetRoute()
	var pg prioritygroupv3.PriorityGroupClusterSpecifier
	if err := ra.GetInlineClusterSpecifierPlugin().GetExtension().GetTypedConfig().UnmarshalTo(&pg); err != nil {
		return fmt.Errorf("route (a): %w", err)
	}
	fo := &envoysim.FailoverConfig{Namespace: pg.GetOverrideMetadataNamespace(), IncludeAttemptCount: vh.GetIncludeRequestAttemptCount(),
		Credentials: map[string][2]string{}}
	for _, g := range pg.GetPriorityGroups() {
		if cs := g.GetClusters(); len(cs) > 0 {
			fo.Groups = append(fo.Groups, cs[0].GetClusterName())
		}
	}
	rp := ra.GetRetryPolicy()
	fo.RetryOn = strings.Split(rp.GetRetryOn(), ",")
	for _, c := range rp.GetRetriableStatusCodes() {
		fo.RetriableStatusCodes = append(fo.RetriableStatusCodes, int(c))
	}
	fo.NumRetries = 1
	if n := rp.GetNumRetries(); n != nil {
		fo.NumRetries = int(n.GetValue())
	}
	fo.PerTryTimeout = rp.GetPerTryTimeout().AsDuration()
	if !rp.GetRefreshClusterOnRetry() {
		return fmt.Errorf("route (a): refresh_cluster_on_retry is off: retries would stay on the first cluster")
	}
	if hs := r.GetMatch().GetHeaders(); len(hs) == 1 && hs[0].GetPresentMatch() {
		cfg.ClusterHeader = hs[0].GetName()
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if !ok {
			continue
		}
		var hpo upstreamhttpv3.HttpProtocolOptions
		if err := opts.UnmarshalTo(&hpo); err != nil {
			return err
		}
		for _, f := range hpo.GetHttpFilters() {
			var ep extprocv3.ExternalProcessor
			var hm headermutationv3.HeaderMutation
			var ci credentialv3.CredentialInjector
			switch {
			case f.GetTypedConfig().MessageIs(&ep):
				if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
					return err
				}
				fo.Attempt = extProcConfig(&ep)
			case f.GetTypedConfig().MessageIs(&hm):
				if err := f.GetTypedConfig().UnmarshalTo(&hm); err != nil {
					return err
				}
				fo.Remove = nil
				for _, m := range hm.GetMutations().GetRequestMutations() {
					if k := m.GetRemove(); k != "" {
						fo.Remove = append(fo.Remove, k)
					}
				}
			case f.GetTypedConfig().MessageIs(&ci):
				if err := f.GetTypedConfig().UnmarshalTo(&ci); err != nil {
					return err
				}
				var g genericv3.Generic
				if err := ci.GetCredential().GetTypedConfig().UnmarshalTo(&g); err != nil {
					return err
				}
				h := g.GetHeader()
				if h == "" {
					h = "authorization"
				}
				fo.Credentials[c.GetName()] = [2]string{strings.ToLower(h), "secret-" + c.GetName()}
			}
		}
	}
	cfg.Failover = fo
	return nil
}

// extProcConfig reads an ext_proc filter's settings.
func extProcConfig(ep *extprocv3.ExternalProcessor) envoysim.ExtProcConfig {
	pm := ep.GetProcessingMode()
	c := envoysim.ExtProcConfig{
		RequestHeaderMode:   pm.GetRequestHeaderMode(),
		ResponseHeaderMode:  pm.GetResponseHeaderMode(),
		RequestBodyMode:     pm.GetRequestBodyMode(),
		ResponseBodyMode:    pm.GetResponseBodyMode(),
		ResponseTrailerMode: pm.GetResponseTrailerMode(),
		AllowModeOverride:   ep.GetAllowModeOverride(),
		FailureModeAllow:    ep.GetFailureModeAllow(),
		AllowEnvoy:          ep.GetMutationRules().GetAllowEnvoy().GetValue(),
		MessageTimeout:      ep.GetMessageTimeout().AsDuration(),
		RequestAttributes:   ep.GetRequestAttributes(),
		ResponseAttributes:  ep.GetResponseAttributes(),
		ReceivingNamespaces: ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(),
		InitialMetadata:     map[string]string{},
		ObservabilityMode:   ep.GetObservabilityMode(),
		// Envoy's default deferred_close_timeout is 5 s.
		ForwardingNamespaces: ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(),
		DeferredClose:        ep.GetDeferredCloseTimeout().AsDuration(),
	}
	if c.MessageTimeout == 0 {
		c.MessageTimeout = 200e6 // Envoy's default
	}
	for _, md := range ep.GetGrpcService().GetInitialMetadata() {
		c.InitialMetadata[md.GetKey()] = md.GetValue()
	}
	return c
}

// oneRouteSettings takes a route's own settings (rc: the headers it
// removes, its timeouts, its retry policy) into cfg. envoysim plays one
// set for every route, so a route whose settings differ from the first
// route's is refused, naming both: before, the last route read won, and a
// test ran every route on it.
func oneRouteSettings(cfg, rc *envoysim.Config, name string, from, timeoutsFrom *string) error {
	if *from == "" {
		cfg.RequestHeadersToRemove, cfg.RetryOn, cfg.RetryBackOff, cfg.NumRetries = rc.RequestHeadersToRemove, rc.RetryOn, rc.RetryBackOff, rc.NumRetries
		*from = name
	} else {
		switch {
		case !slices.Equal(cfg.RequestHeadersToRemove, rc.RequestHeadersToRemove):
			return differs("request_headers_to_remove", *from, name)
		case !slices.Equal(cfg.RetryOn, rc.RetryOn) || cfg.RetryBackOff != rc.RetryBackOff || cfg.NumRetries != rc.NumRetries:
			return differs("retry_policy", *from, name)
		}
	}
	return oneTimeout(cfg, rc, name, timeoutsFrom)
}

// oneTimeout is oneRouteSettings for the timeouts alone (the failover
// route has its own retry policy, played apart).
func oneTimeout(cfg, rc *envoysim.Config, name string, from *string) error {
	if *from == "" {
		cfg.RouteTimeout, cfg.StreamIdleTimeout = rc.RouteTimeout, rc.StreamIdleTimeout
		*from = name
		return nil
	}
	switch {
	case cfg.RouteTimeout != rc.RouteTimeout:
		return differs("timeout", *from, name)
	case cfg.StreamIdleTimeout != rc.StreamIdleTimeout:
		return differs("idle_timeout", *from, name)
	}
	return nil
}

func differs(field, a, b string) error {
	return fmt.Errorf("routes %q and %q differ in %s: envoysim plays one route setting for all routes", a, b, field)
}
