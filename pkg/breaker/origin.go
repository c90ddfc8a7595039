package breaker

// Origins of a failure (SPEC R-FD1): whether the provider answered.
const (
	// OriginUpstream: the provider answered — a listed status, an error
	// event, a dead turn, a slow or stalled answer.
	OriginUpstream = "upstream"
	// OriginLocal: Envoy got no answer — a connection refused, reset or
	// timed out before headers, TLS, no healthy host (UF, UC, UR, LR,
	// UPE, UH, URX); what Envoy's outlier detection calls locally
	// originated. It may be this replica's egress, not the route.
	OriginLocal = "local"
)

// Origin is the failure's origin, "" for an outcome that is not a failure.
func (o Outcome) Origin() string { return OriginOf(o.Class, o.Reason) }

// OriginOf is the origin of an outcome of class c with reason: Envoy's
// own endings before an answer (connection_error, timeout: a timeout
// after the answer began is a neither, cut_mid_answer) are local, every
// other failure upstream; "" when c is not Failure.
func OriginOf(c Class, reason string) string {
	if c != Failure {
		return ""
	}
	switch reason {
	case ReasonConnection, ReasonTimeout:
		return OriginLocal
	}
	return OriginUpstream
}

// OriginLabel is OriginOf for an outcome's class label ("failure",
// "success", "neither"): the outcome counter's origin label.
func OriginLabel(class, reason string) string {
	if class != Failure.String() {
		return ""
	}
	return OriginOf(Failure, reason)
}

// TransitionOrigin is the origin of the evidence that moved a breaker, by
// its reason: a count of connection errors or timeouts is local, of the
// provider's answers (a status, a dead turn, slow calls) upstream; a
// failure rate mixes them, and a cooldown, probe, reset or force is not
// evidence of a failure: "".
func TransitionOrigin(reason string) string {
	switch reason {
	case ReasonConnection, ReasonTimeout:
		return OriginLocal
	case ReasonProvider5xx, ReasonProvider429, ReasonProviderStatus, ReasonDeadTurn, ReasonOpenStatus,
		ReasonSlowCallRate, ReasonSlowCallRateStall, ReasonSlowCallRateBaseline:
		return OriginUpstream
	}
	return ""
}
