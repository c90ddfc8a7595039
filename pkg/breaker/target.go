package breaker

import "context"

// Target is where one attempt goes: a route breaker and, when the route
// belongs to a fleet, the fleet's global breaker. Each judges the attempt
// with its own installed policy (SPEC §4); each has its own mode (R-M4).
type Target struct {
	Route    Key
	Fleet    Key
	HasFleet bool
}

// TargetAdmission carries both admissions.
type TargetAdmission struct {
	Route, Fleet Admission
}

// TargetVerdict is the combined answer of a target's breakers.
type TargetVerdict struct {
	// Verdict is what prod breakers say: not Allowed when a prod breaker is
	// unhealthy or any breaker is forced open (R-S5 applies to shadow too).
	Verdict
	// WouldSkip: a shadow breaker is unhealthy; prod would have skipped
	// the route, shadow dispatches to it and lists it (R-M2, R-M4).
	WouldSkip bool
	// sharedUnhealthy: a breaker's shared state (not one replica's own
	// open) made the target unhealthy; ReplicaScoped is left only when
	// none did.
	sharedUnhealthy bool
}

// Peek combines the verdicts: the target is unhealthy when either prod
// breaker is, and recovers when both have (the later time). Off breakers are
// not consulted.
func (t *Target) Peek(ctx context.Context, st Store, now int64) TargetVerdict {
	var tv TargetVerdict
	tv.Allowed, tv.Off = true, true
	tv.merge(st.Peek(ctx, t.Route, now))
	if t.HasFleet {
		tv.merge(st.Peek(ctx, t.Fleet, now))
	}
	return tv
}

func (tv *TargetVerdict) merge(v Verdict) {
	if v.Off {
		return
	}
	tv.Off = false
	if v.RampPermille > 0 && !v.Shadow && (tv.RampPermille == 0 || v.RampPermille < tv.RampPermille) {
		// The smaller share of the two breakers (route, fleet) holds.
		tv.RampPermille = v.RampPermille
	}
	if v.Saturated {
		// A route's quota (R-H2): only the route breaker has one. In
		// shadow mode it is listed, never passed over (R-M4).
		if v.Shadow {
			tv.WouldSkip = true
		} else {
			tv.Saturated, tv.SaturatedUntil = true, max(tv.SaturatedUntil, v.SaturatedUntil)
		}
	}
	if v.Allowed {
		return
	}
	if v.Shadow && !v.Forced {
		tv.WouldSkip = true
		if v.RecoveryAt > tv.RecoveryAt && !tv.Allowed {
			tv.RecoveryAt = v.RecoveryAt
		}
		return
	}
	tv.Allowed = false
	tv.sharedUnhealthy = tv.sharedUnhealthy || !v.ReplicaScoped
	tv.ReplicaScoped = !tv.sharedUnhealthy
	tv.Forced = tv.Forced || v.Forced
	tv.Blocked = tv.Blocked || v.Blocked
	tv.ProbesFull = tv.ProbesFull || v.ProbesFull
	if v.State > tv.State {
		tv.State = v.State
	}
	if v.RecoveryAt > tv.RecoveryAt {
		tv.RecoveryAt = v.RecoveryAt
	}
}

// Acquire admits the attempt on both breakers. When the fleet refuses after
// the route took a slot, the route's slot is given back. A store error
// admits (R-D7).
func (t *Target) Acquire(ctx context.Context, st Store, now int64, force bool) (TargetAdmission, bool) {
	var a TargetAdmission
	ra, ok, _ := st.Acquire(ctx, t.Route, now, force)
	if !ok {
		return a, false
	}
	a.Route = ra
	if t.HasFleet {
		fa, ok, _ := st.Acquire(ctx, t.Fleet, now, force)
		if !ok {
			_ = st.Release(ctx, t.Route, a.Route)
			return TargetAdmission{}, false
		}
		a.Fleet = fa
	}
	return a, true
}

// Record records the attempt's result on both breakers. A breaker that did
// not judge it (off, or no longer installed) comes back with Applied false.
func (t *Target) Record(ctx context.Context, st Store, now int64, a TargetAdmission, r Result) (route, fleet Recorded, err error) {
	route, err = st.Record(ctx, t.Route, now, a.Route, r)
	if t.HasFleet {
		var ferr error
		fleet, ferr = st.Record(ctx, t.Fleet, now, a.Fleet, r)
		if err == nil {
			err = ferr
		}
	}
	return route, fleet, err
}

// Release frees any probe slots without recording (R-O8: a neither frees its
// slot; also used when a request is never dispatched).
func (t *Target) Release(ctx context.Context, st Store, a TargetAdmission) {
	_ = st.Release(ctx, t.Route, a.Route)
	if t.HasFleet {
		_ = st.Release(ctx, t.Fleet, a.Fleet)
	}
}
