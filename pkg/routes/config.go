package routes

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// File is the YAML configuration document of SPEC §2, as written. It is
// decoded strictly (unknown fields are errors) and then compiled into an
// immutable Runtime; nothing on the request path reads a File.
type File struct {
	Listen    Listen        `yaml:"listen"`
	Limits    LimitsSpec    `yaml:"limits"`
	AccessLog AccessLogSpec `yaml:"access_log"`
	// DecisionWaitSec is how long a decision whose route-role stream ended
	// before its response (Envoy 1.37+ closes it after the last request
	// reply, R-DL3) waits for the channel that sees the response.
	DecisionWaitSec *int64                 `yaml:"decision_wait_sec"`
	Envoy           EnvoySpec              `yaml:"envoy"`
	Admin           AdminConfig            `yaml:"admin"`
	Store           StoreConfig            `yaml:"store"`
	Tracing         TracingConfig          `yaml:"tracing"`
	Headers         Headers                `yaml:"headers"`
	Policies        map[string]*PolicySpec `yaml:"policies"`
	Fleets          []FleetSpec            `yaml:"fleets"`
	Gateways        []GatewaySpec          `yaml:"gateways"`
}

// TracingConfig is the tracing section (SPEC §17, R-TR1): off unless
// enabled here or OTEL_TRACES_EXPORTER=otlp in the environment; each field
// set here wins over its OTEL_* variable. Start-only.
type TracingConfig struct {
	Enabled *bool `yaml:"enabled"`
	// Endpoint is the OTLP collector's URL (http://host:4317 for gRPC,
	// http://host:4318 for HTTP; the HTTP exporter adds /v1/traces).
	Endpoint string `yaml:"endpoint"`
	// Protocol is grpc or http/protobuf.
	Protocol    string `yaml:"protocol"`
	ServiceName string `yaml:"service_name"`
}

// Listen holds the two listener addresses.
type Listen struct {
	// GRPC is host:port, or unix:///absolute/path for a Unix domain
	// socket (Envoy's pipe address), which a sidecar shares with Envoy
	// in one pod's volume and no one else can reach over the network.
	GRPC       string     `yaml:"grpc"`
	Admin      string     `yaml:"admin"`
	TLS        TLSConfig  `yaml:"tls"`
	GRPCSocket SocketSpec `yaml:"grpc_socket"`
}

// SocketSpec sets the file mode and ownership of the ext_proc listener's
// Unix domain socket: whoever can write to it can report outcomes, so it
// is no wider than the owner and group by default.
type SocketSpec struct {
	Mode  string `yaml:"mode"`  // octal; "" = DefaultSocketMode
	Owner string `yaml:"owner"` // user name or uid; "" = this process's
	Group string `yaml:"group"` // group name or gid; "" = this process's (or the directory's, when it is setgid)
}

// UnixSocketPath returns the path of a unix:///path listen address, and
// whether addr is one.
func UnixSocketPath(addr string) (string, bool) {
	p, ok := strings.CutPrefix(addr, "unix://")
	return p, ok
}

// TLSConfig serves both listeners over TLS, and the ext_proc listener with
// mutual TLS when a client CA is set (R-L5). Empty = plaintext. The files
// are re-read when they change.
type TLSConfig struct {
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// LimitsSpec bounds what a peer can make fusebox hold (R-L1, R-L6, R-L10,
// R-L13).
type LimitsSpec struct {
	MaxMessageBytes      *int64 `yaml:"max_message_bytes"`
	MaxConcurrentStreams *int64 `yaml:"max_concurrent_streams"`
	MaxConfigBytes       *int64 `yaml:"max_config_bytes"`
	MaxStreamIdleSec     *int64 `yaml:"max_stream_idle_sec"`
	MaxStreamDurationSec *int64 `yaml:"max_stream_duration_sec"`
}

// Limits are the resolved limits.
type Limits struct {
	MaxMessageBytes      int
	MaxConcurrentStreams int
	MaxConfigBytes       int64
	// MaxStreamIdle: a stream with no message for this long ends (as a
	// neither); MaxStreamDuration: no stream lives longer (R-L13).
	MaxStreamIdle     time.Duration
	MaxStreamDuration time.Duration
}

// Defaults and bounds of limits (SPEC §12).
const (
	DefaultMaxMessageBytes      = 32 << 20
	MinMaxMessageBytes          = 16<<20 + 64<<10
	DefaultMaxConcurrentStreams = 100000
	// A little above the shipped Envoy configs' stream_idle_timeout (300 s):
	// Envoy ends an idle request first, fusebox only what Envoy forgot.
	DefaultMaxStreamIdleSec = 360
	// An hour: longer than any LLM response the shipped route timeouts let through.
	DefaultMaxStreamDurationSec = 3600
)

func (l LimitsSpec) resolved() Limits {
	out := Limits{MaxMessageBytes: DefaultMaxMessageBytes, MaxConcurrentStreams: DefaultMaxConcurrentStreams,
		MaxConfigBytes: DefaultMaxConfigBytes, MaxStreamIdle: DefaultMaxStreamIdleSec * time.Second,
		MaxStreamDuration: DefaultMaxStreamDurationSec * time.Second}
	if l.MaxConfigBytes != nil {
		out.MaxConfigBytes = *l.MaxConfigBytes
	}
	if l.MaxStreamIdleSec != nil {
		out.MaxStreamIdle = time.Duration(*l.MaxStreamIdleSec) * time.Second
	}
	if l.MaxStreamDurationSec != nil {
		out.MaxStreamDuration = time.Duration(*l.MaxStreamDurationSec) * time.Second
	}
	if l.MaxMessageBytes != nil {
		out.MaxMessageBytes = int(*l.MaxMessageBytes)
	}
	if l.MaxConcurrentStreams != nil {
		out.MaxConcurrentStreams = int(*l.MaxConcurrentStreams)
	}
	return out
}

// AccessLogSpec configures the access log channel (SPEC §4a).
type AccessLogSpec struct {
	// WaitMs is how long a route-role stream that ended without a response
	// waits for Envoy's access log entry before it is a neither.
	WaitMs *int64 `yaml:"wait_ms"`
}

// EnvoySpec says how the Envoy in front of fusebox is deployed (R-X8).
type EnvoySpec struct {
	// Failover: the deployment runs the attempt role in every provider
	// cluster (envoy/envoy-failover.yaml). The attempt role then records
	// every attempt, the route role never records, and every decision
	// carries a chain. Start-only.
	Failover bool `yaml:"failover"`
	// Observer: the deployment runs a second ext_proc filter in
	// observability mode that sees the response (envoy/envoy-observer.yaml,
	// x-fusebox-role: observe). The route role then answers the request
	// phases only, and the observer judges and records each response off
	// Envoy's critical path (#28). Start-only.
	Observer bool `yaml:"observer"`
}

// DefaultAccessLogWaitMs is access_log.wait_ms unset.
const DefaultAccessLogWaitMs = 2000

// DefaultDecisionWaitSec is decision_wait_sec unset: the shipped Envoy
// configs' stream_idle_timeout, the longest Envoy waits for response
// headers (R-DL3).
const DefaultDecisionWaitSec = 300

// AdminConfig configures the admin API.
type AdminConfig struct {
	// TokenEnv names the environment variable that holds the bearer token.
	TokenEnv string `yaml:"token_env"`
}

// StoreConfig selects and configures the breaker store (SPEC §7).
type StoreConfig struct {
	Backend string      `yaml:"backend"`
	Memory  MemoryStore `yaml:"memory"`
	Redis   RedisStore  `yaml:"redis"`
}

// MemoryStore configures the in-process store.
type MemoryStore struct {
	PersistPath string `yaml:"persist_path"`
}

// RedisStore configures the shared store.
type RedisStore struct {
	URL         string `yaml:"url"`
	KeyPrefix   string `yaml:"key_prefix"`
	OpTimeoutMs *int64 `yaml:"op_timeout_ms"`
	// HMACKeyFile holds the fleet key that signs feed messages and overlay
	// documents (R-L12); "" = unsigned.
	HMACKeyFile string `yaml:"hmac_key_file"`
	// OverlayCache is the local overlay cache file (R-ST15); nil = the
	// default (DefaultOverlayCache), "" = none.
	OverlayCache *string `yaml:"overlay_cache"`
}

// OverlayCachePath is where store.redis.overlay_cache says the cache
// goes: the default file under the OS cache dir when unset ("" when there
// is none), nothing when set to "".
func (r RedisStore) OverlayCachePath() string {
	if r.OverlayCache != nil {
		return *r.OverlayCache
	}
	return DefaultOverlayCache()
}

// DefaultOverlayCache is <os cache dir>/fusebox/overlays.json, "" when the
// OS names no cache dir.
func DefaultOverlayCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "fusebox", "overlays.json")
}

// Headers are the header names fusebox reads and writes.
type Headers struct {
	Gateway   string `yaml:"gateway"`
	Model     string `yaml:"model"`
	Residency string `yaml:"residency"`
	Cluster   string `yaml:"cluster"`
	Route     string `yaml:"route"`
	Fallbacks string `yaml:"fallbacks"`
}

// FleetSpec is a failure domain shared by routes of every gateway.
type FleetSpec struct {
	Name           string      `yaml:"name"`
	CircuitBreaker *PolicySpec `yaml:"circuit_breaker"`
}

// GatewaySpec is one tenant configuration.
type GatewaySpec struct {
	ID             string        `yaml:"id"`
	CircuitBreaker *PolicySpec   `yaml:"circuit_breaker"`
	Failover       *FailoverSpec `yaml:"failover"`
	Models         []ModelSpec   `yaml:"models"`
	Routes         []RouteSpec   `yaml:"routes"`

	// source and doc are where the gateway comes from ("file" or
	// "admin") and its document as written, in JSON (R-API2).
	source string
	doc    []byte
}

// ModelSpec maps a client-facing model name to its routes.
type ModelSpec struct {
	Name           string        `yaml:"name"`
	Order          string        `yaml:"order"`
	Routes         []string      `yaml:"routes"`
	CircuitBreaker *PolicySpec   `yaml:"circuit_breaker"`
	Failover       *FailoverSpec `yaml:"failover"`
}

// FailoverSpec is in-request failover (SPEC §11): how many routes one
// request may try, through Envoy's retries (Envoy ≥ 1.40). 1 = off.
type FailoverSpec struct {
	MaxAttempts *int64 `yaml:"max_attempts"`
}

// RouteSpec is one independently failing upstream.
type RouteSpec struct {
	Key            string      `yaml:"key"`
	Cluster        string      `yaml:"cluster"`
	CostPerMtok    *float64    `yaml:"cost_per_mtok"`
	Bias           *float64    `yaml:"bias"`
	Residency      []string    `yaml:"residency"`
	UpstreamModel  string      `yaml:"upstream_model"`
	Path           string      `yaml:"path"`
	API            string      `yaml:"api"`
	SelfHosted     bool        `yaml:"self_hosted"`
	Fleet          string      `yaml:"fleet"`
	CircuitBreaker *PolicySpec `yaml:"circuit_breaker"`
}

// Defaults of the non-policy sections (SPEC §2).
const (
	DefaultGRPCAddr     = "127.0.0.1:50051"
	DefaultSocketMode   = "0660"
	DefaultAdminAddr    = "127.0.0.1:8090"
	DefaultTokenEnv     = "FUSEBOX_ADMIN_TOKEN"
	DefaultRedisURL     = "redis://127.0.0.1:6379/0"
	DefaultKeyPrefix    = "fusebox:"
	DefaultOpTimeoutMs  = 50
	DefaultGateway      = "default"
	OrderListed         = "listed"
	OrderCheapest       = "cheapest"
	APIOpenAI           = "openai"
	APIAnthropic        = "anthropic"
	StoreMemory         = "memory"
	StoreRedis          = "redis"
	DefaultHeaderPrefix = "x-fusebox-"
)

// DefaultHeaders are the header names of SPEC §2.
func DefaultHeaders() Headers {
	return Headers{
		Gateway:   "x-fusebox-gateway",
		Model:     "x-fusebox-model",
		Residency: "x-fusebox-residency",
		Cluster:   "x-fusebox-cluster",
		Route:     "x-fusebox-route",
		Fallbacks: "x-fusebox-fallbacks",
	}
}

func (f *File) applyDefaults() {
	if f.Listen.GRPC == "" {
		f.Listen.GRPC = DefaultGRPCAddr
	}
	if f.Listen.GRPCSocket.Mode == "" {
		f.Listen.GRPCSocket.Mode = DefaultSocketMode
	}
	if f.Listen.Admin == "" {
		f.Listen.Admin = DefaultAdminAddr
	}
	if f.Admin.TokenEnv == "" {
		f.Admin.TokenEnv = DefaultTokenEnv
	}
	if f.Store.Backend == "" {
		f.Store.Backend = StoreMemory
	}
	if f.Store.Redis.URL == "" {
		f.Store.Redis.URL = DefaultRedisURL
	}
	if f.Store.Redis.KeyPrefix == "" {
		f.Store.Redis.KeyPrefix = DefaultKeyPrefix
	}
	d := DefaultHeaders()
	for _, p := range []struct {
		dst *string
		def string
	}{
		{&f.Headers.Gateway, d.Gateway}, {&f.Headers.Model, d.Model}, {&f.Headers.Residency, d.Residency},
		{&f.Headers.Cluster, d.Cluster}, {&f.Headers.Route, d.Route}, {&f.Headers.Fallbacks, d.Fallbacks},
	} {
		if *p.dst == "" {
			*p.dst = p.def
		}
	}
}
