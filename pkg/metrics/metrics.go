package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every collector fusebox exports.
type Metrics struct {
	Registry *prometheus.Registry

	Transitions     *prometheus.CounterVec   // gateway, route, provider, scope, transition, reason
	State           *prometheus.GaugeVec     // gateway, route, provider, scope
	Outcomes        *prometheus.CounterVec   // gateway, route, class, reason, origin
	Decisions       *prometheus.CounterVec   // gateway, model, action
	ClusterNotFound *prometheus.CounterVec   // gateway, cluster
	MessageDuration *prometheus.HistogramVec // phase
	StreamsActive   prometheus.Gauge
	StoreErrors     *prometheus.CounterVec // op
	ConfigReloads   *prometheus.CounterVec // result
	ConfigFallbacks prometheus.Counter
	// InternalErrors counts panics and store errors absorbed on the request
	// path (R-D7); not in the SPEC's fixed list, so it has its own name.
	InternalErrors *prometheus.CounterVec // kind
	// AccessLogEntries counts the access log channel's entries by what
	// became of them (SPEC §4a).
	AccessLogEntries *prometheus.CounterVec // result
	// Refused counts what a limit turned away (R-L1, R-L4, R-L6).
	Refused *prometheus.CounterVec // what
	// RouteHeadroom is the last quota a route's provider announced
	// (gateway, route, kind: requests or tokens); HeadroomIgnored counts the
	// header values not trusted, by reason (SPEC §15).
	RouteHeadroom   *prometheus.GaugeVec
	HeadroomIgnored *prometheus.CounterVec
	// BreakerMode is 1 for each breaker's resolved mode (off, shadow,
	// prod; gateway, route, scope): an alert on aig_circuit_breaker_state
	// leaves shadow breakers out with it (R-M2: they route nothing).
	BreakerMode *prometheus.GaugeVec
	// DecisionEvents counts the events that reached a decision's lifecycle
	// by what became of them (R-DL2: duplicates, late outcomes, unreachable
	// meeting place, forged notes).
	DecisionEvents *prometheus.CounterVec // event, result
	// DeploymentMismatch counts streams of a role the config does not
	// deploy (R-DL10).
	DeploymentMismatch *prometheus.CounterVec // what
	// RouteBaseline is a route's latency baseline (R-T6).
	RouteBaseline *prometheus.GaugeVec // gateway, route
	// ReplicaScopedOpen is 1 while this replica's own view of its egress
	// holds a route open (R-FD3).
	ReplicaScopedOpen *prometheus.GaugeVec // gateway, route
	// RequestFaults counts attempts whose failure was judged the
	// request's own (R-FD4).
	RequestFaults *prometheus.CounterVec // gateway, model
	// ReplicasAlive is how many replicas share the store (R-FD2).
	ReplicasAlive prometheus.Gauge
}

// Values of fusebox_refused_total{what}.
const (
	RefusedMessageTooLarge = "message_too_large"
	RefusedStreamLimit     = "stream_limit"
	RefusedAdminBody       = "admin_body_too_large"
	RefusedAdminOrigin     = "admin_cross_origin"
	RefusedAdminHost       = "admin_host"
	RefusedAdminType       = "admin_content_type"
	RefusedAdminAuth       = "admin_auth"
	// An admin JSON body over the depth or element bound (R-L13).
	RefusedAdminJSON = "admin_json_bounds"
	// A config file the reloader would not read (R-L10).
	RefusedConfigFile = "config_file"
	// A persist_path file that did not decode, moved aside at start.
	RefusedPersistCorrupt = "persist_corrupt"
	// Streams ended by limits.max_stream_idle_sec / max_stream_duration_sec.
	RefusedStreamIdle     = "stream_idle"
	RefusedStreamDuration = "stream_duration"
	// Feed messages and overlay documents dropped for a missing or bad
	// HMAC (R-L12).
	RefusedUnsignedFeed    = "feed_unsigned"
	RefusedUnsignedOverlay = "overlay_unsigned"
	RefusedUnsignedNote    = "note_unsigned"
)

// New creates the collectors on a fresh registry that also carries the Go
// and process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aig_circuit_breaker_transitions_total",
			Help: "Circuit breaker state transitions.",
		}, []string{"gateway", "route", "provider", "scope", "transition", "reason"}),
		State: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "aig_circuit_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 open, 2 half_open.",
		}, []string{"gateway", "route", "provider", "scope"}),
		Outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aig_circuit_breaker_outcomes_total",
			Help: "Attempt outcomes recorded per breaker; a failure's origin is upstream (the provider answered) or local (Envoy got no answer), R-FD1.",
		}, []string{"gateway", "route", "class", "reason", "origin"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aig_circuit_breaker_decisions_total",
			Help: "Routing decisions by action.",
		}, []string{"gateway", "model", "action"}),
		ClusterNotFound: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aig_extproc_cluster_not_found_total",
			Help: "Responses where Envoy did not know the cluster fusebox chose (a configuration error).",
		}, []string{"gateway", "cluster"}),
		MessageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "aig_extproc_message_duration_seconds",
			Help:    "Time to answer one ext_proc message, by phase.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}, []string{"phase"}),
		StreamsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "aig_extproc_streams_active",
			Help: "ext_proc streams currently open.",
		}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aig_store_errors_total",
			Help: "Store operations that failed.",
		}, []string{"op"}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aig_config_reloads_total",
			Help: "Config reload attempts by result.",
		}, []string{"result"}),
		ConfigFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aig_config_fallbacks_total",
			Help: "Malformed stored status lists replaced by the default (fail closed).",
		}),
		InternalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_internal_errors_total",
			Help: "Panics and store errors absorbed on the request path without failing the request.",
		}, []string{"kind"}),
		RouteBaseline: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fusebox_route_latency_baseline_seconds",
			Help: "A route's p50 latency of successes over the last 15 minutes (R-T6), for routes with slow_call_baseline_multiplier.",
		}, []string{"gateway", "route"}),
		ReplicaScopedOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fusebox_replica_scoped_open",
			Help: "1 while this replica alone holds a route open (R-FD3): its Envoy got no answer from the provider (its egress may be at fault) and too few replicas saw the same for the fleet to open it.",
		}, []string{"gateway", "route"}),
		RequestFaults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_request_faults_total",
			Help: "Attempts whose failure was judged the request's own, not the route's (R-FD4): the same answer again for the same request (a client's retry) while its routes answer other requests; recorded as neither (request_fault).",
		}, []string{"gateway", "model"}),
		ReplicasAlive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fusebox_replicas_alive",
			Help: "Replicas sharing the store (Redis) that beat lately, this one included (R-FD2): the quorum for locally originated failures is capped at it. 0 on the memory store.",
		}),
		AccessLogEntries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_access_log_entries_total",
			Help: "Envoy access log entries received, by what became of them: recorded, duplicate, unknown_decision, no_decision, cluster_mismatch, ignored.",
		}, []string{"result"}),
		DecisionEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_decision_events_total",
			Help: "Events that reached a decision's lifecycle, by event (park, expire, arrive, entry, observe, record, recheck) and result (recorded, late, duplicate, mismatch, forged, meet_unreachable, already_applied, not_held, settled_elsewhere).",
		}, []string{"event", "result"}),
		DeploymentMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_deployment_mismatch_total",
			Help: "Streams of a role the envoy section does not deploy (attempt_without_failover, observer_without_observer, response_phases_in_failover).",
		}, []string{"what"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_refused_total",
			Help: "Requests and streams a limit turned away, by what was refused.",
		}, []string{"what"}),
		RouteHeadroom: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fusebox_route_headroom",
			Help: "The quota a route's provider last announced as left (R-H4): remaining requests or tokens, from its x-ratelimit-* or anthropic-ratelimit-* response headers.",
		}, []string{"gateway", "route", "kind"}),
		HeadroomIgnored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fusebox_headroom_ignored_total",
			Help: "Rate-limit header values not trusted (R-H6), by why: negative, not_a_number, bad_reset, reset_too_far, repeated.",
		}, []string{"reason"}),
		BreakerMode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fusebox_breaker_mode",
			Help: "1 for each breaker's resolved circuit_breaker mode: off, shadow (tracked, routes nothing, R-M2) or prod; 0 for a disabled breaker's.",
		}, []string{"gateway", "route", "scope", "mode"}),
	}
	reg.MustRegister(m.Transitions, m.State, m.Outcomes, m.Decisions, m.ClusterNotFound,
		m.MessageDuration, m.StreamsActive, m.StoreErrors, m.ConfigReloads, m.ConfigFallbacks,
		m.InternalErrors, m.Refused, m.RouteBaseline, m.AccessLogEntries, m.DecisionEvents, m.DeploymentMismatch,
		m.RouteHeadroom, m.HeadroomIgnored, m.BreakerMode, m.ReplicaScopedOpen, m.ReplicasAlive, m.RequestFaults,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Pre-create the reload series so a scrape shows zeros before any reload.
	m.ConfigReloads.WithLabelValues("success")
	m.ConfigReloads.WithLabelValues("error")
	for _, w := range []string{RefusedMessageTooLarge, RefusedStreamLimit, RefusedAdminBody, RefusedAdminOrigin, RefusedAdminHost,
		RefusedAdminType, RefusedAdminAuth, RefusedAdminJSON, RefusedConfigFile, RefusedPersistCorrupt, RefusedStreamIdle,
		RefusedStreamDuration, RefusedUnsignedFeed, RefusedUnsignedOverlay} {
		m.Refused.WithLabelValues(w)
	}
	return m
}
