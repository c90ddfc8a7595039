package breaker

// Verdict is a breaker's answer to "may a request go here now?".
type Verdict struct {
	// The fields are laid out widest first: a Verdict is returned by value
	// through the Store interface on every decision, and with its int64s
	// behind the bools the copy straddled 8-byte boundaries and stalled on
	// store forwarding: BenchmarkDecisionClosed went from 24 ns to 12 ns
	// with this order alone (TestVerdictIsWidestFirst keeps it).

	// SaturatedUntil: see Saturated.
	SaturatedUntil int64
	// RecoveryAt is when the breaker may admit again (R-D6), unix ns;
	// Never for a route forced open without a duration; 0 when allowed.
	RecoveryAt int64
	// RampPermille is the share of its traffic a closed route takes on its
	// recovery ramp (R-D8), per mille; 0 = not ramping (all of it).
	RampPermille uint16
	// Allowed: healthy by this breaker's state (for a shadow breaker, what
	// prod would have done; the decision dispatches anyway, R-M4).
	Allowed bool
	State   State
	Forced  bool
	Blocked bool
	// Saturated: the route's provider announced less quota than its
	// headroom floors (R-H2), until SaturatedUntil (unix ns). It does not
	// make the route unhealthy (Allowed is the breaker's): selection
	// passes it over while another route can take the request, and never
	// leaves a model with no route for it.
	Saturated bool
	// ProbesFull: half-open with every probe slot taken.
	ProbesFull bool
	// Shadow: the breaker's policy is shadow: it is never skipped, only
	// listed under would_skip (R-M4).
	Shadow bool
	// Off: the breaker's policy is off or disabled: not consulted (R-M1).
	Off bool
	// ReplicaScoped: the verdict is this replica's own view of its egress
	// (R-FD2, R-FD3): locally originated failures opened the route here
	// alone, while the shared state still admits it.
	ReplicaScoped bool
}

// Admission is what a dispatched request carries until its outcome is
// recorded: the generation it was admitted in and, for a half-open probe,
// its slot.
type Admission struct {
	Gen   uint64
	Lease uint64 // 0 = holds no probe slot
}

// Recorded tells the caller what a Record did.
type Recorded struct {
	Outcome Outcome
	// Stale: the admission was from an earlier generation; the outcome is
	// counted in metrics only (R-S6).
	Stale bool
	// Applied: the breaker judged the attempt. False when its policy is
	// off: nothing is recorded or counted (R-M1).
	Applied bool
	// AlreadyApplied: the record's key was applied before (R-DL11): this
	// call changed nothing, and Applied is false.
	AlreadyApplied bool
}
