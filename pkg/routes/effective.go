package routes

import (
	"encoding/json"
	"net/url"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Effective returns the configuration in force as a document with the
// config file's field names: every default applied and every policy
// resolved through its templates and levels (R-P3), so an operator sees
// exactly what each route's breaker runs with (`extproc config`). The
// document is itself a valid config that compiles to the same policies.
func (rt *Runtime) Effective() map[string]any {
	policy := func(p *breaker.Policy) map[string]any {
		b, _ := json.Marshal(p)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return m
	}
	doc := map[string]any{
		"listen": map[string]any{"grpc": rt.Listen.GRPC, "admin": rt.Listen.Admin, "tls": map[string]any{
			"cert_file": rt.Listen.TLS.CertFile, "key_file": rt.Listen.TLS.KeyFile, "client_ca_file": rt.Listen.TLS.ClientCAFile},
			"grpc_socket": map[string]any{"mode": rt.Listen.GRPCSocket.Mode, "owner": rt.Listen.GRPCSocket.Owner, "group": rt.Listen.GRPCSocket.Group}},
		"access_log":        map[string]any{"wait_ms": rt.AccessLogWait.Milliseconds()},
		"decision_wait_sec": int64(rt.DecisionWait / time.Second),
		"envoy":             map[string]any{"failover": rt.Envoy.Failover, "observer": rt.Envoy.Observer},
		"limits": map[string]any{"max_message_bytes": rt.Limits.MaxMessageBytes, "max_concurrent_streams": rt.Limits.MaxConcurrentStreams,
			"max_config_bytes": rt.Limits.MaxConfigBytes, "max_stream_idle_sec": int64(rt.Limits.MaxStreamIdle / time.Second),
			"max_stream_duration_sec": int64(rt.Limits.MaxStreamDuration / time.Second)},
		"admin":   map[string]any{"token_env": rt.Admin.TokenEnv},
		"headers": map[string]any{"gateway": rt.Headers.Gateway, "model": rt.Headers.Model, "residency": rt.Headers.Residency, "cluster": rt.Headers.Cluster, "route": rt.Headers.Route, "fallbacks": rt.Headers.Fallbacks},
	}
	store := map[string]any{"backend": rt.Store.Backend, "memory": map[string]any{"persist_path": rt.Store.Memory.PersistPath}}
	redis := map[string]any{"url": redactURL(rt.Store.Redis.URL), "key_prefix": rt.Store.Redis.KeyPrefix}
	if rt.Store.Redis.OpTimeoutMs != nil {
		redis["op_timeout_ms"] = *rt.Store.Redis.OpTimeoutMs
	}
	store["redis"] = redis
	doc["store"] = store
	fleets := []any{}
	for _, name := range rt.FleetNames {
		fleets = append(fleets, map[string]any{"name": name, "circuit_breaker": policy(rt.Fleets[name].Policy)})
	}
	doc["fleets"] = fleets
	gws := []any{}
	for _, id := range rt.GatewayIDs {
		g := rt.Gateways[id]
		models := []any{}
		for _, name := range g.ModelNames {
			m := g.Models[name]
			var keys []string
			for _, r := range m.Candidates(nil) {
				keys = append(keys, r.Key)
			}
			models = append(models, map[string]any{"name": m.Name, "order": m.Order, "routes": keys, "circuit_breaker": policy(m.Policy),
				"failover": map[string]any{"max_attempts": m.MaxAttempts}})
		}
		rs := []any{}
		for _, r := range g.RouteList {
			e := map[string]any{"key": r.Key, "cluster": r.Cluster, "cost_per_mtok": r.CostPerMtok, "bias": r.Bias,
				"residency": r.Residency, "upstream_model": r.UpstreamModel, "path": r.Path, "api": r.API,
				"self_hosted": r.SelfHosted, "circuit_breaker": policy(r.Policy)}
			if r.Residency == nil {
				e["residency"] = []string{}
			}
			if r.Fleet != nil {
				e["fleet"] = r.Fleet.Name
			} else {
				e["fleet"] = ""
			}
			rs = append(rs, e)
		}
		gws = append(gws, map[string]any{"id": g.ID, "circuit_breaker": policy(g.Policy), "models": models, "routes": rs})
	}
	doc["gateways"] = gws
	return doc
}

// redactURL hides a password in a store URL: the effective config is
// printed and may be pasted into a ticket.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "REDACTED")
	}
	return u.String()
}
