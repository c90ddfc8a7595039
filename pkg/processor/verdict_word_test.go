package processor

import (
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
)

// TestVerdictWord: each breaker answer is named as R-TR2 says; a
// replica-scoped open (R-FD3) is named as such, not as the route's open.
func TestVerdictWord(t *testing.T) {
	for _, tc := range []struct {
		v    breaker.Verdict
		want string
	}{
		{breaker.Verdict{State: breaker.Open}, tracing.VerdictOpen},
		{breaker.Verdict{State: breaker.Open, ReplicaScoped: true}, tracing.VerdictReplicaOpen},
		{breaker.Verdict{State: breaker.HalfOpen, ProbesFull: true, ReplicaScoped: true}, tracing.VerdictReplicaOpen},
		{breaker.Verdict{State: breaker.HalfOpen, ProbesFull: true}, tracing.VerdictHalfOpenFull},
		{breaker.Verdict{State: breaker.Open, Forced: true}, tracing.VerdictForced},
		{breaker.Verdict{Blocked: true}, tracing.VerdictRetryAfter},
		{breaker.Verdict{Allowed: true, Saturated: true}, tracing.VerdictSaturated},
		{breaker.Verdict{Allowed: true, RampPermille: 500}, tracing.VerdictRamp},
		{breaker.Verdict{Allowed: true}, tracing.VerdictFloor},
	} {
		if got := verdictWord(tc.v); got != tc.want {
			t.Errorf("verdictWord(%+v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
