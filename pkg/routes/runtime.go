package routes

import (
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Runtime is a compiled configuration: validated, defaults applied, policies
// resolved, candidates ordered. It is immutable; a reload builds a new one and
// swaps it atomically (see Holder), so a request keeps the Runtime it started
// with.
type Runtime struct {
	Listen Listen
	Limits Limits
	// AccessLogWait is access_log.wait_ms.
	AccessLogWait time.Duration
	// DecisionWait is decision_wait_sec (R-DL3).
	DecisionWait time.Duration
	Admin        AdminConfig
	// Envoy is the envoy section (start-only).
	Envoy    EnvoySpec
	Store    StoreConfig
	Tracing  TracingConfig
	Headers  Headers
	Gateways map[string]*Gateway
	// GatewayIDs lists gateways in file order.
	GatewayIDs []string
	Fleets     map[string]*Fleet
	FleetNames []string
	// Warnings are legal but doubtful things found at load (R-P5).
	Warnings []string
	// Fallbacks are malformed status lists replaced by the default during a
	// lenient load of stored config (R-P2).
	Fallbacks []Fallback
	// Hash identifies the source document (SHA-256 hex).
	Hash string
}

// Fallback records one R-P2 fail-closed substitution.
type Fallback struct {
	Where         string // e.g. `gateway "default" route "openai:us:x"`
	Field         string
	Problem       string
	PolicyVersion string // version of the resolved policy that used the default
}

// Fleet is a global failure domain (scope global).
type Fleet struct {
	Name   string
	Policy *breaker.Policy
}

// BreakerKey is the breaker id of the fleet in status output: "fleet:<name>".
func (f *Fleet) BreakerKey() string { return "fleet:" + f.Name }

// Gateway is one compiled tenant.
type Gateway struct {
	ID string
	// Source is "file" or "admin" (an overlay, R-API2a).
	Source string
	// Doc is the gateway's document as written, in JSON with the config
	// file's field names: what GET returns and PATCH merges onto.
	Doc []byte
	// Policy is the gateway-level resolved policy (template → gateway).
	Policy *breaker.Policy
	Models map[string]*Model
	// ModelNames lists models in file order.
	ModelNames []string
	Routes     map[string]*Route
	// RouteList holds every route in file order.
	RouteList []*Route
}

// Model is a client-facing model name and its candidate routes.
type Model struct {
	Name  string
	Order string
	API   string
	// MaxAttempts is failover.max_attempts (gateway, model override):
	// 1 = no in-request failover (SPEC §11).
	MaxAttempts int
	// Policy is the model-level resolved policy: it supplies the decision
	// settings (when_all_open, max_ejection_percent, mode of the stage).
	Policy *breaker.Policy
	// candidates is in routing order (R-D1).
	candidates []*Route
}

// Route is one upstream with its own breaker.
type Route struct {
	Key           string
	Provider      string
	Cluster       string
	CostPerMtok   float64
	Bias          float64
	Residency     []string
	UpstreamModel string
	Path          string
	API           string
	SelfHosted    bool
	Fleet         *Fleet
	// Policy is the fully resolved route policy (R-P3).
	Policy *breaker.Policy
	// Index is the route's position in the gateway's routes list.
	Index int
}

// ProviderOf returns the provider of a route key: the text before the first
// ':' (the whole key when there is none).
func ProviderOf(key string) string {
	if i := strings.IndexByte(key, ':'); i >= 0 {
		return key[:i]
	}
	return key
}

// Gateway returns the gateway with id; an empty id means "default" (R-D4).
func (rt *Runtime) Gateway(id string) (*Gateway, bool) {
	if id == "" {
		id = DefaultGateway
	}
	g, ok := rt.Gateways[id]
	return g, ok
}

// Model returns the model by name.
func (g *Gateway) Model(name string) (*Model, bool) {
	m, ok := g.Models[name]
	return m, ok
}

// Candidates returns the model's routes in routing order, keeping only those
// that carry every requested residency tag (R-D1). With no tags it returns
// the precomputed slice without allocating; callers must not modify it.
func (m *Model) Candidates(residency []string) []*Route {
	if len(residency) == 0 {
		return m.candidates
	}
	out := make([]*Route, 0, len(m.candidates))
	for _, r := range m.candidates {
		if r.HasResidency(residency) {
			out = append(out, r)
		}
	}
	return out
}

// HasResidency reports whether the route carries every tag.
func (r *Route) HasResidency(tags []string) bool {
	for _, t := range tags {
		found := false
		for _, have := range r.Residency {
			if have == t {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ParseResidency splits a residency header value: comma-separated tags,
// trimmed, empty ones dropped.
func ParseResidency(v string) []string {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	parts := strings.Split(v, ",")
	out := parts[:0]
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// BreakerSpecs lists every breaker the Runtime configures: each gateway's
// routes in file order, then the fleets (R-P11).
func (rt *Runtime) BreakerSpecs() []breaker.Spec {
	var specs []breaker.Spec
	for _, id := range rt.GatewayIDs {
		g := rt.Gateways[id]
		for _, r := range g.RouteList {
			specs = append(specs, breaker.Spec{ID: breaker.RouteID(g.ID, r.Key), Policy: r.Policy})
		}
	}
	for _, name := range rt.FleetNames {
		specs = append(specs, breaker.Spec{ID: breaker.FleetID(name), Policy: rt.Fleets[name].Policy})
	}
	return specs
}
