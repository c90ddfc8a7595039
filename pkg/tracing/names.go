package tracing

// The span, event and attribute names of SPEC §17. They are fixed:
// operators' queries and dashboards name them, and docs/tracing.md lists
// them (test/readme holds the two together).
const (
	SpanDecide      = "fusebox.decide"
	SpanOutcome     = "fusebox.outcome"
	SpanAttempt     = "fusebox.attempt"
	EventTransition = "fusebox.transition"

	AttrModel         = "gen_ai.request.model"
	AttrProvider      = "gen_ai.provider.name"
	AttrGateway       = "fusebox.gateway"
	AttrRoute         = "fusebox.route"
	AttrDecision      = "fusebox.decision"
	AttrDecidedBy     = "fusebox.decided_by"
	AttrState         = "fusebox.breaker.state"
	AttrGeneration    = "fusebox.breaker.generation"
	AttrPolicyVersion = "fusebox.policy_version"
	AttrReplica       = "fusebox.replica"
	AttrCandidates    = "fusebox.candidates"
	AttrAction        = "fusebox.action"

	AttrOutcomeClass   = "fusebox.outcome.class"
	AttrOutcomeReason  = "fusebox.outcome.reason"
	AttrOutcomeOrigin  = "fusebox.outcome.origin"
	AttrOutcomeChannel = "fusebox.outcome.channel"

	AttrAttempt = "fusebox.attempt"

	AttrTransition          = "fusebox.transition"
	AttrTransitionReason    = "fusebox.transition.reason"
	AttrTransitionFailures  = "fusebox.transition.failures"
	AttrTransitionThreshold = "fusebox.transition.threshold"
	AttrTransitionOpenUntil = "fusebox.transition.open_until"
)

// The verdicts of fusebox.candidates: chosen, or why a candidate was
// passed over.
const (
	VerdictChosen       = "chosen"
	VerdictOpen         = "open"
	VerdictHalfOpenFull = "half_open_full"
	VerdictRetryAfter   = "retry_after"
	VerdictSaturated    = "saturated"
	VerdictResidency    = "residency"
	VerdictRamp         = "ramp"
	VerdictFloor        = "floor"
	VerdictForced       = "forced"
	// VerdictReplicaOpen: this replica's own open (R-FD3): its egress got
	// no answer, the fleet's state still admits the route.
	VerdictReplicaOpen = "replica_open"
)

// The channels an outcome arrives by (fusebox.outcome.channel).
const (
	ChannelStream    = "stream"     // the route role's or attempt role's own stream
	ChannelAccessLog = "access_log" // Envoy's access log entry
	ChannelObserver  = "observer"   // the observer profile's stream
	ChannelExpiry    = "expiry"     // nothing came: the wait ended
)
