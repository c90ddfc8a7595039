package routes

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"go.yaml.in/yaml/v3"
)

// ConfigError lists every problem found in a configuration document. Each
// problem names the gateway, model or route and the field it is about.
type ConfigError struct {
	Problems []string
}

func (e *ConfigError) Error() string {
	if len(e.Problems) == 1 {
		return "invalid config: " + e.Problems[0]
	}
	return fmt.Sprintf("invalid config (%d problems):\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// Options change how a document is compiled.
type Options struct {
	// Lenient is for stored config written by someone else (R-P2): a
	// malformed status-code list is replaced by the default and recorded
	// in Runtime.Fallbacks instead of failing the load.
	Lenient bool
}

// Parse decodes and compiles a YAML (or JSON) document.
func Parse(data []byte, opt Options) (*Runtime, error) {
	f, err := decodeFile(data, opt)
	if err != nil {
		return nil, err
	}
	return compileHashed(f, data, opt)
}

// decodeFile decodes a document strictly. Its errors name the line, the
// YAML path and the field, and come with the compiler's problems over what
// did decode.
func decodeFile(data []byte, opt Options) (*File, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		var te *yaml.TypeError
		switch {
		case errors.Is(err, io.EOF):
			return nil, &ConfigError{Problems: []string{"the document is empty"}}
		case errors.As(err, &te):
			var root yaml.Node
			_ = yaml.Unmarshal(data, &root)
			problems := make([]string, 0, len(te.Errors))
			for _, e := range te.Errors {
				problems = append(problems, withFieldPath(friendlyYAMLError(e), &root))
			}
			return nil, &ConfigError{Problems: append(problems, locateProblems(compileProblems(&f, opt), data)...)}
		default:
			return nil, &ConfigError{Problems: []string{pinpointIndent(friendlyYAMLError(err.Error()), data)}}
		}
	}
	return &f, nil
}

func compileHashed(f *File, data []byte, opt Options) (*Runtime, error) {
	rt, err := Compile(f, opt)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.Problems = locateProblems(ce.Problems, data)
		}
		return nil, err
	}
	if int64(len(data)) > rt.Limits.MaxConfigBytes {
		return nil, &ConfigError{Problems: []string{fmt.Sprintf("limits.max_config_bytes: the document is %d bytes, over the limit of %d", len(data), rt.Limits.MaxConfigBytes)}}
	}
	sum := sha256.Sum256(data)
	rt.Hash = hex.EncodeToString(sum[:])
	return rt, nil
}

// compileProblems runs the compiler over a partially decoded file only to
// collect its problems alongside the decoder's.
func compileProblems(f *File, opt Options) []string {
	_, err := Compile(f, opt)
	var ce *ConfigError
	if errors.As(err, &ce) {
		return ce.Problems
	}
	return nil
}

type compiler struct {
	opt       Options
	problems  []string
	warnings  []string
	fallbacks []Fallback
	templates map[string]*PolicySpec
	// envoyFailover is envoy.failover (a model's max_attempts needs it).
	envoyFailover bool
}

func (c *compiler) errf(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// Compile validates a decoded File (R-P1..R-P8) and builds its Runtime.
func Compile(f *File, opt Options) (*Runtime, error) {
	f.applyDefaults()
	c := &compiler{opt: opt, templates: f.Policies, envoyFailover: f.Envoy.Failover}
	rt := &Runtime{
		Listen:   f.Listen,
		Limits:   f.Limits.resolved(),
		Admin:    f.Admin,
		Envoy:    f.Envoy,
		Store:    f.Store,
		Tracing:  f.Tracing,
		Headers:  f.Headers,
		Gateways: map[string]*Gateway{},
		Fleets:   map[string]*Fleet{},
	}
	if f.Envoy.Failover && f.Envoy.Observer {
		c.errf("envoy: failover and observer cannot both be true: in the failover deployment the attempt role records every attempt (envoy/envoy-failover.yaml); the observer is for envoy/envoy-observer.yaml")
	}
	c.checkTracing(f.Tracing)
	rt.AccessLogWait = DefaultAccessLogWaitMs * time.Millisecond
	if v := f.AccessLog.WaitMs; v != nil {
		if *v < 0 || *v > 60000 {
			c.errf("access_log.wait_ms: must be in 0..60000, got %d", *v)
		}
		rt.AccessLogWait = time.Duration(*v) * time.Millisecond
	}
	rt.DecisionWait = DefaultDecisionWaitSec * time.Second
	if v := f.DecisionWaitSec; v != nil {
		if *v < 1 || *v > 3600 {
			c.errf("decision_wait_sec: must be in 1..3600, got %d", *v)
		}
		rt.DecisionWait = time.Duration(*v) * time.Second
	}
	c.checkListen(f)
	c.checkLimits(f)
	c.checkStore(f)
	c.checkHeaders(f)

	names := make([]string, 0, len(f.Policies))
	for n := range f.Policies {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		spec := f.Policies[n]
		where := fmt.Sprintf("policies.%s", n)
		if spec == nil {
			continue
		}
		c.specProblems(where, spec)
		if spec.Policy != "" {
			c.errf("%s: circuit_breaker.policy: a template cannot name another template (%q)", where, spec.Policy)
		}
	}

	for i, fs := range f.Fleets {
		where := fmt.Sprintf("fleets[%d]", i)
		if fs.Name == "" {
			c.errf("%s: name: must not be empty", where)
			continue
		}
		where = fmt.Sprintf("fleet %q", fs.Name)
		if !validName(fs.Name) {
			c.errf("%s: name: use letters, digits, '-', '_' and '.' only", where)
		}
		if _, dup := rt.Fleets[fs.Name]; dup {
			c.errf("%s: name: defined twice", where)
			continue
		}
		p := c.resolve(where, breaker.DefaultPolicy(), fs.CircuitBreaker)
		rt.Fleets[fs.Name] = &Fleet{Name: fs.Name, Policy: p}
		rt.FleetNames = append(rt.FleetNames, fs.Name)
	}

	if len(f.Gateways) == 0 {
		c.errf("gateways: at least one gateway is required")
	}
	for i := range f.Gateways {
		gs := &f.Gateways[i]
		if gs.ID == "" {
			c.errf("gateways[%d]: id: must not be empty", i)
			continue
		}
		if !ValidGatewayID(gs.ID) {
			c.errf("gateways[%d]: id %q: letters, digits, '.', '_' and '-' only, at most 64, starting with a letter or digit (it names Redis keys and a feed field)", i, gs.ID)
			continue
		}
		if _, dup := rt.Gateways[gs.ID]; dup {
			c.errf("gateway %q: id: defined twice", gs.ID)
			continue
		}
		if g := c.gateway(gs, rt); g != nil {
			rt.Gateways[g.ID] = g
			rt.GatewayIDs = append(rt.GatewayIDs, g.ID)
		}
	}
	if len(c.problems) > 0 {
		return nil, &ConfigError{Problems: c.problems}
	}
	rt.Warnings = c.warnings
	rt.Fallbacks = c.fallbacks
	return rt, nil
}

// specProblems reports the decode errors of one circuit_breaker level. In
// lenient mode malformed status lists are not problems (R-P2).
func (c *compiler) specProblems(where string, s *PolicySpec) {
	if s.silent {
		return
	}
	for _, e := range s.errs {
		c.errf("%s: %s", where, e.String())
	}
	if !c.opt.Lenient && !s.lenient {
		for _, e := range s.codeErrs {
			c.errf("%s: %s", where, e.String())
		}
	}
}

// resolve overlays template and level onto base and finishes the policy.
// Decode problems are reported once, by whoever owns the spec.
func (c *compiler) resolve(where string, base breaker.Policy, s *PolicySpec) *breaker.Policy {
	p := base
	var fell []fieldError
	if s != nil {
		c.specProblems(where, s)
		if s.Policy != "" {
			t, ok := c.templates[s.Policy]
			switch {
			case !ok:
				c.errf("%s: circuit_breaker.policy: unknown policy template %q%s", where, s.Policy, didYouMean(s.Policy, templateNames(c.templates)))
			case t != nil:
				t.applyTo(&p)
				if c.opt.Lenient || t.lenient {
					fell = append(fell, t.codeErrs...)
				}
			}
		}
		s.applyTo(&p)
		if c.opt.Lenient || s.lenient {
			fell = append(fell, s.codeErrs...)
		}
	}
	if len(fell) > 0 {
		for _, e := range fell {
			switch e.field {
			case "failure_status_codes":
				p.FailureStatusCodes = slices.Clone(breaker.DefaultFailureStatusCodes)
			case "open_on_status_codes":
				p.OpenOnStatusCodes = []int{}
			}
		}
	}
	if p.BackoffMultiplier > 1 && p.MaxCooldownMs < p.CooldownMs {
		c.errf("%s: circuit_breaker.max_cooldown_ms: %d is below cooldown_ms %d while backoff_multiplier is %g",
			where, p.MaxCooldownMs, p.CooldownMs, p.BackoffMultiplier)
	}
	pp := &p
	pp.Finish()
	if len(fell) > 0 {
		for _, e := range fell {
			c.fallbacks = append(c.fallbacks, Fallback{Where: where, Field: e.field, Problem: e.msg, PolicyVersion: pp.Version})
		}
	}
	return pp
}

// quiet returns a copy of s whose problems are not reported again: a route's
// level is resolved once per model that uses it, but its problems are listed
// once.
func quiet(s *PolicySpec) *PolicySpec {
	if s == nil {
		return nil
	}
	q := *s
	q.silent = true
	return &q
}

// maxAttempts resolves failover.max_attempts: the model's, else the
// gateway's, else 1; each checked to be a whole number in 1..10.
func (c *compiler) maxAttempts(where string, gw, model *FailoverSpec) int {
	n := int64(1)
	for _, f := range []*FailoverSpec{gw, model} {
		if f == nil || f.MaxAttempts == nil {
			continue
		}
		if v := *f.MaxAttempts; v < 1 || v > 10 {
			c.errf("%s: failover.max_attempts: must be a whole number in 1..10, got %d", where, v)
		} else {
			n = v
		}
	}
	return int(n)
}

func (c *compiler) gateway(gs *GatewaySpec, rt *Runtime) *Gateway {
	gw := fmt.Sprintf("gateway %q", gs.ID)
	g := &Gateway{ID: gs.ID, Source: gs.source, Doc: gs.doc, Models: map[string]*Model{}, Routes: map[string]*Route{}}
	if g.Source == "" {
		g.Source = SourceFile
	}
	g.Policy = c.resolve(gw, breaker.DefaultPolicy(), gs.CircuitBreaker)

	for i := range gs.Routes {
		rs := &gs.Routes[i]
		r := c.route(gw, i, rs, rt)
		if r == nil {
			continue
		}
		if _, dup := g.Routes[r.Key]; dup {
			c.errf("%s: route %q: key: defined twice", gw, r.Key)
			continue
		}
		g.Routes[r.Key] = r
		g.RouteList = append(g.RouteList, r)
	}
	specOf := map[string]*RouteSpec{}
	for i := range gs.Routes {
		specOf[gs.Routes[i].Key] = &gs.Routes[i]
	}
	for _, rs := range gs.Routes {
		if rs.CircuitBreaker != nil {
			// Report a route's own decode problems once, here.
			c.specProblems(fmt.Sprintf("%s: route %q", gw, rs.Key), rs.CircuitBreaker)
		}
	}

	usedBy := map[string]string{}
	if len(gs.Models) == 0 {
		c.errf("%s: models: at least one model is required", gw)
	}
	for i := range gs.Models {
		ms := &gs.Models[i]
		if ms.Name == "" {
			c.errf("%s: models[%d]: name: must not be empty", gw, i)
			continue
		}
		mw := fmt.Sprintf("%s: model %q", gw, ms.Name)
		if err := checkEntryName(ms.Name); err != nil {
			c.errf("%s: name: %v", mw, err)
			continue
		}
		if _, dup := g.Models[ms.Name]; dup {
			c.errf("%s: name: defined twice", mw)
			continue
		}
		m := &Model{Name: ms.Name, Order: ms.Order, MaxAttempts: c.maxAttempts(mw, gs.Failover, ms.Failover)}
		if m.MaxAttempts > 1 && !c.envoyFailover {
			c.warnings = append(c.warnings, fmt.Sprintf("%s: failover.max_attempts is %d but envoy.failover is false: without the attempt role (envoy/envoy-failover.yaml) Envoy makes one attempt", mw, m.MaxAttempts))
		}
		if m.Order == "" {
			m.Order = OrderListed
		}
		if m.Order != OrderListed && m.Order != OrderCheapest {
			c.errf("%s: order: must be listed or cheapest, got %q", mw, ms.Order)
		}
		m.Policy = c.resolve(mw, *g.Policy, ms.CircuitBreaker)
		if len(ms.Routes) == 0 {
			c.errf("%s: routes: at least one route is required", mw)
		}
		seen := map[string]bool{}
		for _, key := range ms.Routes {
			r, ok := g.Routes[key]
			if !ok {
				if _, defined := specOf[key]; !defined {
					c.errf("%s: routes: %q is not a route of this gateway%s", mw, key, didYouMean(key, routeKeys(gs)))
				}
				continue
			}
			if seen[key] {
				c.errf("%s: routes: %q is listed twice", mw, key)
				continue
			}
			seen[key] = true
			rp := c.resolve(fmt.Sprintf("%s: route %q", mw, key), *m.Policy, quiet(specOf[key].CircuitBreaker))
			if prev, shared := usedBy[key]; shared && r.Policy.Version != rp.Version {
				c.errf("%s: route %q resolves to a different circuit_breaker policy than in model %q; a route has one breaker, so its models must agree (policy_version %s vs %s)",
					mw, key, prev, rp.Version, r.Policy.Version)
			}
			if _, shared := usedBy[key]; !shared {
				usedBy[key] = ms.Name
				r.Policy = rp
			}
			m.candidates = append(m.candidates, r)
		}
		for _, r := range m.candidates {
			if m.API == "" {
				m.API = r.API
			} else if r.API != m.API {
				c.errf("%s: routes: all routes of a model must speak the same api; %q speaks %q but %q speaks %q",
					mw, m.candidates[0].Key, m.API, r.Key, r.API)
				break
			}
		}
		if len(ms.Routes) == 1 {
			c.warnings = append(c.warnings, fmt.Sprintf("%s is served by a single route (%s): the breaker has nowhere to route around it", mw, ms.Routes[0]))
		}
		orderCandidates(m)
		g.Models[m.Name] = m
		g.ModelNames = append(g.ModelNames, m.Name)
	}
	for _, r := range g.RouteList {
		if r.Policy == nil {
			r.Policy = c.resolve(fmt.Sprintf("%s: route %q", gw, r.Key), *g.Policy, quiet(specOf[r.Key].CircuitBreaker))
			c.warnings = append(c.warnings, fmt.Sprintf("%s: route %q is not used by any model", gw, r.Key))
		}
	}
	return g
}

func (c *compiler) route(gw string, i int, rs *RouteSpec, rt *Runtime) *Route {
	if rs.Key == "" {
		c.errf("%s: routes[%d]: key: must not be empty", gw, i)
		return nil
	}
	rw := fmt.Sprintf("%s: route %q", gw, rs.Key)
	if err := checkRouteKey(rs.Key); err != nil {
		c.errf("%s: key: %v", rw, err)
	}
	r := &Route{
		Key: rs.Key, Provider: ProviderOf(rs.Key), Cluster: rs.Cluster, Bias: 1,
		Residency: rs.Residency, UpstreamModel: rs.UpstreamModel, Path: rs.Path,
		API: rs.API, SelfHosted: rs.SelfHosted, Index: i,
	}
	if r.Cluster == "" {
		c.errf("%s: cluster: must not be empty", rw)
	} else if !validClusterName(r.Cluster) {
		c.errf("%s: cluster: %q may hold only letters, digits and . _ - : / characters", rw, r.Cluster)
	}
	if rs.CostPerMtok != nil {
		if v := *rs.CostPerMtok; v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			c.errf("%s: cost_per_mtok: must be a finite number ≥0, got %g", rw, v)
		}
		r.CostPerMtok = *rs.CostPerMtok
	}
	if rs.Bias != nil {
		// R-L8: NaN compares false with everything and would make the
		// cheapest ordering depend on the sort's internals.
		if v := *rs.Bias; !(v > 0) || math.IsInf(v, 0) {
			c.errf("%s: bias: must be a finite number >0, got %g", rw, v)
		}
		r.Bias = *rs.Bias
	}
	for j, t := range rs.Residency {
		if strings.TrimSpace(t) != t || t == "" || strings.Contains(t, ",") {
			c.errf("%s: residency[%d]: %q must be a non-empty tag without commas or surrounding spaces", rw, j, t)
		}
	}
	if r.API == "" {
		r.API = APIOpenAI
	}
	if r.API != APIOpenAI && r.API != APIAnthropic {
		c.errf("%s: api: must be openai or anthropic, got %q", rw, rs.API)
	}
	if r.Path != "" && !strings.HasPrefix(r.Path, "/") {
		c.errf("%s: path: must start with '/', got %q", rw, r.Path)
	} else if !printableASCII(r.Path) {
		// R-L8: a CR or LF here would be written into :path.
		c.errf("%s: path: must be printable ASCII (no spaces or control characters), got %q", rw, r.Path)
	}
	if strings.ContainsAny(r.UpstreamModel, "\"\\\n\r") {
		c.errf("%s: upstream_model: must not contain quotes, backslashes or newlines", rw)
	}
	if rs.Fleet != "" {
		fl, ok := rt.Fleets[rs.Fleet]
		if !ok {
			c.errf("%s: fleet: unknown fleet %q", rw, rs.Fleet)
		}
		r.Fleet = fl
	}
	return r
}

// orderCandidates sorts a model's candidates into routing order (R-D1):
// listed keeps the list; cheapest sorts by cost_per_mtok × bias ascending,
// ties in listed order.
func orderCandidates(m *Model) {
	if m.Order != OrderCheapest {
		return
	}
	sort.SliceStable(m.candidates, func(i, j int) bool {
		return m.candidates[i].CostPerMtok*m.candidates[i].Bias < m.candidates[j].CostPerMtok*m.candidates[j].Bias
	})
}

func routeKeys(gs *GatewaySpec) []string {
	out := make([]string, 0, len(gs.Routes))
	for _, r := range gs.Routes {
		out = append(out, r.Key)
	}
	return out
}

func templateNames(t map[string]*PolicySpec) []string {
	out := make([]string, 0, len(t))
	for n := range t {
		out = append(out, n)
	}
	return out
}
