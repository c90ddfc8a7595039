package envoysim

import (
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// Config is the deployment the proxy plays. NewConfigFromEnvoy (in the
// envoy package tests) fills it from envoy/envoy.yaml so the two cannot
// drift.
type Config struct {
	// StripPrefix: client headers starting with it are removed before the
	// route is computed (HCM early_header_mutation).
	StripPrefix string
	// GatewayHeader / Gateway: set by the header_mutation filter for the
	// virtual host.
	GatewayHeader string
	Gateway       string
	// VHostHeaders are further headers the virtual host's header_mutation
	// sets (e.g. a residency for an EU listener).
	VHostHeaders map[string]string
	ExtProc      ExtProcConfig
	// Tracing is the connection manager's OpenTelemetry tracer (nil = no
	// tracing): tracing.go.
	Tracing *TracingConfig
	// ResponseHeadersToAdd are the virtual host's response_headers_to_add:
	// a literal value, or %DYNAMIC_METADATA(namespace:key)% (not added
	// when empty, as Envoy's formatter leaves it).
	ResponseHeadersToAdd []HeaderToAdd
	// ChunkDelays makes Stats keep each response chunk's upstream->client
	// delay (Stats.ChunkDelays): measurements and conformance tests.
	ChunkDelays bool
	// Observer, when set, is a second ext_proc filter after ExtProc, in
	// observability mode (the observer profile, envoy-observer.yaml).
	Observer *ExtProcConfig
	// ClusterHeader is route (a)'s cluster_header; requests without it go
	// to DefaultCluster (route (b)).
	ClusterHeader  string
	DefaultCluster string
	// DefaultRoutes are the routes before the catch-all (b), in order: a
	// request without the cluster header whose :path starts with Prefix
	// goes to Cluster (envoy.yaml: Anthropic's Messages API to Anthropic).
	DefaultRoutes []PrefixRoute
	Clusters      map[string]*Cluster
	// RequestHeadersToRemove are removed before a request goes upstream.
	RequestHeadersToRemove []string
	RouteTimeout           time.Duration
	// StreamIdleTimeout is the route's idle_timeout, else the connection
	// manager's stream_idle_timeout (0: Envoy's 5 min default; negative:
	// the file turned it off with 0s). idle.go.
	StreamIdleTimeout time.Duration
	RetryOn           []string // "connect-failure", "reset"
	NumRetries        int
	// RetryBackOff is the route's retry_back_off (zero: Envoy's 25 ms base,
	// 10 × base max); retries.go.
	RetryBackOff BackOff
	// BufferLimit is the listener's per-request buffer limit (413 above;
	// 0: Envoy's default, 1 MiB).
	BufferLimit int
	// MaxRequestHeadersKb and MaxHeadersCount are the connection manager's
	// header limits (max_request_headers_kb, common_http_protocol_options
	// max_headers_count; 0: Envoy's defaults, 60 and 100). A header
	// mutation that leaves the request's headers over them fails
	// (headerlimits.go); a response's headers are held to the defaults.
	MaxRequestHeadersKb int
	MaxHeadersCount     int
	// Failover, when set, plays Envoy >= 1.40's in-request failover on
	// route (a) (failover.go).
	Failover *FailoverConfig
	// Envoy is the release played where releases differ (version.go); the
	// zero value plays the current one.
	Envoy Version
	// Runtime holds the bootstrap's static layered_runtime values.
	Runtime map[string]string
	// AccessLog, when set, is the listener's http_grpc access logger.
	AccessLog *AccessLogConfig
}

// BackOff is a retry policy's retry_back_off.
type BackOff struct{ Base, Max time.Duration }

// PrefixRoute is a route matching a :path prefix to a cluster.
type PrefixRoute struct {
	Prefix, Cluster string
}

// Cluster is one upstream.
type Cluster struct {
	Addr string // host:port
	// MaxRequests is the circuit_breakers max_requests threshold
	// (0 = Envoy's default 1024).
	MaxRequests int
	// MaxRetries is the max_retries threshold: retries outstanding on the
	// cluster at once (0 = Envoy's default 3, NoRetries = a threshold of
	// 0, which admits none); RetryBudget, when set, replaces it
	// (retries.go).
	MaxRetries  int
	RetryBudget *RetryBudget
}

// NoRetries is a max_retries threshold of 0: Envoy's canCreate is
// current < max, so no retry is ever admitted.
const NoRetries = -1

// RetryBudget is a circuit_breakers retry_budget.
type RetryBudget struct {
	Percent        float64 // budget_percent (of active + pending requests)
	MinConcurrency int     // min_retry_concurrency
}

// ExtProcConfig mirrors the ext_proc filter's settings.
type ExtProcConfig struct {
	Addr string // fusebox gRPC address; "" = no ext_proc filter
	// Addrs are the fusebox cluster's further hosts (several replicas):
	// each new stream goes to the next host, round robin (hosts.go).
	Addrs              []string
	RequestHeaderMode  filterv3.ProcessingMode_HeaderSendMode
	ResponseHeaderMode filterv3.ProcessingMode_HeaderSendMode
	RequestBodyMode    filterv3.ProcessingMode_BodySendMode
	ResponseBodyMode   filterv3.ProcessingMode_BodySendMode
	// ResponseTrailerMode: SEND shows the processor the response's
	// trailers; otherwise (Envoy's default SKIP) a response that ends with
	// trailers sends no body message with end_of_stream (respond.go).
	ResponseTrailerMode filterv3.ProcessingMode_HeaderSendMode
	AllowModeOverride   bool
	FailureModeAllow    bool
	// AllowEnvoy is mutation_rules.allow_envoy: the processor may set
	// x-envoy-* headers (the route role's x-envoy-max-retries).
	AllowEnvoy     bool
	MessageTimeout time.Duration
	// RequestAttributes are request_attributes, sent with the request
	// headers; envoysim plays xds.cluster_name on the attempt role (an
	// upstream filter: its cluster), and refuses any other (runtime.go).
	RequestAttributes   []string
	ResponseAttributes  []string
	ReceivingNamespaces []string
	InitialMetadata     map[string]string
	// ObservabilityMode is observability_mode: the filter sends without
	// pausing and ignores replies (observe.go). ForwardingNamespaces are
	// metadata_options.forwarding_namespaces.untyped: the dynamic
	// metadata sent in metadata_context. DeferredClose is
	// deferred_close_timeout (0: Envoy's 5 s).
	ObservabilityMode    bool
	ForwardingNamespaces []string
	DeferredClose        time.Duration
	// StreamWindow is the ext_proc cluster's HTTP/2
	// initial_stream_window_size: the side stream's send buffer in
	// observability mode (observe.go); 0 = the release's default.
	StreamWindow int
}

// ServeDefaultsFrom makes every default route (the catch-all and each
// prefix route) go to one upstream, under names of their own: a harness
// that counts what each provider cluster served must not see traffic that
// reached it without fusebox (fusebox down, no model).
func (c *Config) ServeDefaultsFrom(up Cluster) {
	d := up
	c.DefaultCluster = "default:" + c.DefaultCluster
	c.Clusters[c.DefaultCluster] = &d
	for i := range c.DefaultRoutes {
		name := "default:" + c.DefaultRoutes[i].Cluster
		c.DefaultRoutes[i].Cluster = name
		x := up
		c.Clusters[name] = &x
	}
}

// HeaderToAdd is one response_headers_to_add entry.
type HeaderToAdd struct{ Key, Value string }
