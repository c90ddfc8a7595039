package breaker

// Target is where one attempt goes: a route breaker and, when the route
// belongs to a fleet, the fleet's global breaker. Each judges the attempt
// with its own policy (SPEC §4).
type Target struct {
	Route       *Breaker
	RoutePolicy *Policy
	Fleet       *Breaker // nil when the route has no fleet
	FleetPolicy *Policy
}

// TargetAdmission carries both admissions.
type TargetAdmission struct {
	Route, Fleet Admission
}

// Peek combines the verdicts: the target is unhealthy when either breaker
// is, and recovers when both have (the later time). A breaker whose policy
// is not active (off / disabled) is not consulted (R-M1).
func (t *Target) Peek(now int64) Verdict {
	var v Verdict
	v.Allowed = true
	if t.RoutePolicy.Active() {
		v = t.Route.Peek(now, t.RoutePolicy)
	}
	if t.Fleet != nil && t.FleetPolicy.Active() {
		fv := t.Fleet.Peek(now, t.FleetPolicy)
		if !fv.Allowed {
			v.Allowed = false
			v.Forced = v.Forced || fv.Forced
			v.Blocked = v.Blocked || fv.Blocked
			v.ProbesFull = v.ProbesFull || fv.ProbesFull
			if fv.State > v.State {
				v.State = fv.State
			}
			if fv.RecoveryAt > v.RecoveryAt {
				v.RecoveryAt = fv.RecoveryAt
			}
		}
	}
	return v
}

// Acquire admits the attempt on both breakers. When the fleet refuses after
// the route took a slot, the route's slot is given back.
func (t *Target) Acquire(st Store, now int64, shadow, force bool) (TargetAdmission, bool) {
	var a TargetAdmission
	if t.RoutePolicy.Active() {
		ra, ok := st.Acquire(t.Route, now, t.RoutePolicy, shadow || t.RoutePolicy.Mode == ModeShadow, force)
		if !ok {
			return a, false
		}
		a.Route = ra
	}
	if t.Fleet != nil && t.FleetPolicy.Active() {
		fa, ok := st.Acquire(t.Fleet, now, t.FleetPolicy, shadow || t.FleetPolicy.Mode == ModeShadow, force)
		if !ok {
			t.Route.Release(a.Route)
			return a, false
		}
		a.Fleet = fa
	}
	return a, true
}

// Record records the attempt's result on both breakers.
func (t *Target) Record(st Store, now int64, a TargetAdmission, r Result) (route, fleet Recorded, fleetUsed bool) {
	if t.RoutePolicy.Active() {
		route = st.Record(t.Route, now, t.RoutePolicy, a.Route, r)
	}
	if t.Fleet != nil && t.FleetPolicy.Active() {
		fleet = st.Record(t.Fleet, now, t.FleetPolicy, a.Fleet, r)
		fleetUsed = true
	}
	return route, fleet, fleetUsed
}

// Release frees any probe slots without recording (R-O8: a neither frees its
// slot; also used when a request is never dispatched).
func (t *Target) Release(a TargetAdmission) {
	t.Route.Release(a.Route)
	if t.Fleet != nil {
		t.Fleet.Release(a.Fleet)
	}
}
