package breaker

import "testing"

// R-FD1: every failure is local (Envoy got no answer) or upstream (the
// provider answered); the outcome counter, the transition's evidence and
// replay read it from here. Before, no outcome said which.
func TestOrigins(t *testing.T) {
	p := pol(func(p *Policy) { p.FailureStatusCodes = []int{429, 500, 503} })
	cases := []struct {
		res    Result
		origin string
	}{
		{Result{Kind: KindConnError}, OriginLocal},
		{Result{Kind: KindTimeout}, OriginLocal},
		{Result{Kind: KindStatus, Status: 503}, OriginUpstream},
		{Result{Kind: KindStatus, Status: 429}, OriginUpstream},
		{Result{Kind: KindDeadTurn}, OriginUpstream},
		{Result{Kind: KindAnswered, Status: 200}, ""},
		{Result{Kind: KindNeither, Reason: ReasonClientCancel}, ""},
		{Result{Kind: KindNeither, Reason: ReasonCutMidAnswer}, ""},
		{Result{Kind: KindStatus, Status: 400}, ""},
	}
	for _, tc := range cases {
		o := p.Judge(tc.res)
		if got := o.Origin(); got != tc.origin {
			t.Errorf("%+v judged %s %s: origin %q, want %q", tc.res, o.Class, o.Reason, got, tc.origin)
		}
		if got := OriginLabel(o.Class.String(), o.Reason); got != tc.origin {
			t.Errorf("OriginLabel(%s, %s) = %q, want %q", o.Class, o.Reason, got, tc.origin)
		}
	}
	for reason, want := range map[string]string{
		ReasonConnection: OriginLocal, ReasonTimeout: OriginLocal, ReasonProvider5xx: OriginUpstream,
		ReasonOpenStatus: OriginUpstream, ReasonSlowCallRateStall: OriginUpstream,
		ReasonFailureRate: "", ReasonCooldown: "", ReasonProbeSuccess: "", ReasonForced: "",
	} {
		if got := TransitionOrigin(reason); got != want {
			t.Errorf("TransitionOrigin(%s) = %q, want %q", reason, got, want)
		}
	}
}
