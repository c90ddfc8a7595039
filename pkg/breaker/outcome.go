package breaker

// Class is an outcome class (SPEC §4).
type Class uint8

const (
	Neither Class = iota
	Success
	Failure
)

func (c Class) String() string {
	switch c {
	case Success:
		return "success"
	case Failure:
		return "failure"
	}
	return "neither"
}

// Kind is what an attempt did, before any policy judged it.
type Kind uint8

const (
	// KindStatus: the upstream answered with Status and nothing else is
	// known (non-2xx); the policy's lists decide (R-O1, R-O5, R-O7).
	KindStatus Kind = iota
	// KindAnswered: a 2xx that delivered an answer (R-O6).
	KindAnswered
	// KindConnError: Envoy's local reply for a failed or reset upstream
	// connection (R-O2). Always a failure.
	KindConnError
	// KindTimeout: Envoy's upstream timeout (R-O3). Always a failure.
	KindTimeout
	// KindDeadTurn: a clean, empty turn on a self-hosted route (R-O4).
	KindDeadTurn
	// KindNeither: anything that is nobody's fault or cannot be known
	// (R-O7..R-O12, R-O15); Reason says which.
	KindNeither
)

// Failure and neither reasons (the `reason` label values).
const (
	ReasonProvider5xx    = "provider_5xx"
	ReasonProvider429    = "provider_429"
	ReasonProviderStatus = "provider_status"
	ReasonConnection     = "connection_error"
	ReasonTimeout        = "timeout"
	ReasonDeadTurn       = "dead_turn"
	ReasonOpenStatus     = "open_status"
	ReasonFailureRate    = "failure_rate"
	ReasonSlowCallRate   = "slow_call_rate"
	// The slow-call rate, named by the signal that made the calls slow
	// (R-T5, R-T6); plain slow_call_rate is slow_call_ms.
	ReasonSlowCallRateStall    = "slow_call_rate:stall"
	ReasonSlowCallRateBaseline = "slow_call_rate:baseline"
	ReasonSuccess              = "success"
	ReasonClientError          = "client_error"
	ReasonStatusNotListed      = "status_not_listed"
	ReasonClientCancel         = "client_cancel"
	// ReasonCutMidAnswer: one of Envoy's timers (the route timeout, the
	// stream idle timeout, a max duration) cut an answer that had begun
	// (R-AL4): a stream broken mid-flight counts neither way.
	ReasonCutMidAnswer = "cut_mid_answer"
	// ReasonNoOutcome: no channel said what became of a decision or a
	// parked attempt within its wait (an expiry, R-DL2).
	ReasonNoOutcome = "no_outcome"
	// ReasonHeldForQuorum: a locally originated failure the shared state
	// counts only with a quorum of replicas (R-FD2); the replica's own
	// view of the shared state does not count it meanwhile.
	ReasonHeldForQuorum = "held_for_quorum"
	// ReasonRequestFault: the request's failure is its own, not the
	// route's (R-FD4): the same answer on two routes, or again after a
	// client's retry, while the routes answer other requests.
	ReasonRequestFault    = "request_fault"
	ReasonStreamError     = "stream_error"
	ReasonLengthCap       = "length_cap"
	ReasonNoOutput        = "no_output"
	ReasonReasoningOnly   = "reasoning_only"
	ReasonContentFilter   = "content_filter"
	ReasonUnparseable     = "unparseable"
	ReasonClusterNotFound = "cluster_not_found"
	ReasonEnvoyOverflow   = "envoy_overflow"
	ReasonForced          = "forced"
	ReasonForceExpired    = "force_expired"
	ReasonForceClose      = "force_close"
	ReasonReset           = "reset"
	ReasonCooldown        = "cooldown_elapsed"
	ReasonProbeSuccess    = "probe_success"
)

// Result is what one attempt did, as observed by the processor. It is
// judged separately by every breaker that sees the attempt (route and
// fleet), each with its own policy (SPEC §4).
type Result struct {
	// Reason names a KindNeither; every other kind's reason follows from
	// the kind and the judging policy.
	Reason string
	// Key names the record (R-DL11): the decision id and the attempt
	// number. A store applies a key once while it may still arrive
	// (KeyLifeMs, DefaultRecordKeyLife when 0), and answers a repeat with
	// AlreadyApplied. "" (a neither, a test): applied every time.
	Key       string `json:",omitempty"`
	KeyLifeMs int64  `json:",omitempty"`
	Status    int
	// ElapsedMs is the time to the first visible token for a stream, the
	// total time otherwise; -1 when unknown (slow-call trigger, R-O13).
	ElapsedMs int64
	// RetryAfterUnixNano is the deadline of a Retry-After (or retry-after-ms
	// / x-ms-retry-after-ms) on a 429 or 503; 0 when none (R-A1).
	RetryAfterUnixNano int64
	// MaxGapMs is the longest gap between two visible tokens of a stream,
	// 0 when unknown (R-T5).
	MaxGapMs int64
	// BaselineMs is the route's recent p50 latency of successes when the
	// attempt was judged, 0 when there is none yet (R-T6).
	BaselineMs int64
	// SaturateUntil (unix ns): the provider announced less quota than the
	// route's headroom floors, which reset then (R-H2); Unsaturate: it
	// announced at least every floor, which ends a saturation early. The
	// store caps the first by max_retry_after_sec.
	SaturateUntil int64
	// DecidedAt (unix ns, 0 unknown) is when the request this result
	// answers was decided: an announcement of enough headroom ends a
	// saturation only if its request was decided after the saturation
	// began (R-H7); a response to an older request says nothing of the
	// quota now.
	DecidedAt int64
	// The small fields last (see Verdict).
	Kind Kind
	// Counted: the attempt was already counted in the rate window as a
	// stalled call while it ran (R-T5); its outcome must not count it again.
	Counted    bool
	Unsaturate bool
}

// Outcome is a Result judged by one policy.
type Outcome struct {
	// Strings first, then the small fields (see Verdict: an Outcome is
	// returned by value on every Record).
	Reason string
	// SlowBy names the signal that made it slow: "" (slow_call_ms),
	// "stall" or "baseline".
	SlowBy string
	Class  Class
	Slow   bool
	// OpenNow: the status is in open_on_status_codes (R-T3).
	OpenNow bool
	// Counted: see Result.Counted.
	Counted bool
}

// Judge classifies r under p.
func (p *Policy) Judge(r Result) Outcome {
	var o Outcome
	p.judge(&r, &o)
	return o
}

// judge is Judge for the record path, in place: a Result and an Outcome
// are too wide for registers, and copying them in and out of the call
// (an Outcome read back whole just after its fields were written, which
// stalls on store forwarding) was a third of a Record.
func (p *Policy) judge(r *Result, o *Outcome) {
	*o = Outcome{Counted: r.Counted && p.StallMs > 0}
	switch {
	case p.SlowCallMs > 0 && r.ElapsedMs > p.SlowCallMs:
		o.Slow = true
	case p.StallMs > 0 && r.MaxGapMs > p.StallMs:
		o.Slow, o.SlowBy = true, "stall"
	case p.BaselineMultiplier > 0 && r.BaselineMs > 0 && r.ElapsedMs >= 0 && float64(r.ElapsedMs) > p.BaselineMultiplier*float64(r.BaselineMs):
		o.Slow, o.SlowBy = true, "baseline"
	}
	switch r.Kind {
	case KindAnswered:
		o.Class, o.Reason = Success, ReasonSuccess
	case KindConnError:
		o.Class, o.Reason = Failure, ReasonConnection
	case KindTimeout:
		o.Class, o.Reason = Failure, ReasonTimeout
	case KindDeadTurn:
		o.Class, o.Reason = Failure, ReasonDeadTurn
	case KindNeither:
		o.Class, o.Reason = Neither, r.Reason
	case KindStatus:
		switch {
		case p.IsOpenStatus(r.Status):
			o.Class, o.Reason, o.OpenNow = Failure, ReasonOpenStatus, true
		case p.IsFailureStatus(r.Status):
			o.Class = Failure
			switch {
			case r.Status == 429:
				o.Reason = ReasonProvider429
			case r.Status >= 500:
				o.Reason = ReasonProvider5xx
			default:
				o.Reason = ReasonProviderStatus
			}
		case r.Status >= 200 && r.Status < 300:
			// A 2xx judged on status alone (no LLM shape to read).
			o.Class, o.Reason = Success, ReasonSuccess
		case r.Status >= 400 && r.Status < 500:
			o.Class, o.Reason = Neither, ReasonClientError
		default:
			o.Class, o.Reason = Neither, ReasonStatusNotListed
		}
	}
	if o.Class == Neither {
		o.Slow = false
	}
}
