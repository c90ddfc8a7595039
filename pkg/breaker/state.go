package breaker

import "math"

// State is a breaker state (R-S1). The numeric values are the ones of the
// aig_circuit_breaker_state gauge.
type State uint8

const (
	Closed   State = 0
	Open     State = 1
	HalfOpen State = 2
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "unknown"
}

// Scope says whose breaker it is: a gateway's route, or a global fleet.
type Scope string

const (
	ScopeGateway Scope = "gateway"
	ScopeGlobal  Scope = "global"
	// ScopeReplica is no breaker's: it names one replica's own open of a
	// route (R-FD3) in transitions, logs and the dashboard.
	ScopeReplica Scope = "replica"
)

// ID identifies a breaker: gateway + route key for a route breaker; for a
// fleet, Gateway is empty, Route is "fleet:<name>" and Scope is global.
type ID struct {
	Gateway string
	Route   string
	Scope   Scope
}

// RouteID is the ID of a route breaker.
func RouteID(gateway, route string) ID {
	return ID{Gateway: gateway, Route: route, Scope: ScopeGateway}
}

// FleetID is the ID of a fleet breaker.
func FleetID(name string) ID { return ID{Route: "fleet:" + name, Scope: ScopeGlobal} }

// Never is the recovery time of a route forced open without a duration.
const Never = int64(math.MaxInt64)

// Provider is the provider label of the breaker: the route key's text
// before the first ':'; for a fleet, "fleet:<name>".
func (id ID) Provider() string { return providerOf(id) }
