package storetest

import (
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// R-D8: the store keeps the close a recovery ramp runs from. After a probe
// closes the breaker its verdict carries the share (per mille) growing from
// the start to all of it over recovery_ramp_sec; the status shows it; an
// open ends it; a close that is not a probe's (force-close) starts none.
func testRecoveryRamp(t *testing.T, f Factory) {
	p := pol(func(p *breaker.Policy) {
		p.FailureThreshold = 1
		p.RecoveryRampSec, p.RecoveryRampStartPercent = 60, 10
	})
	r := newRig(t, f, p)
	r.halfOpenNow()
	adm, ok := r.acquire(false)
	if !ok {
		t.Fatal("no probe slot")
	}
	r.record(adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200})
	steps := []struct {
		after time.Duration
		want  uint16
	}{{0, 100}, {30 * time.Second, 550}, {15 * time.Second, 775}, {15 * time.Second, 0}}
	for _, s := range steps {
		r.advance(s.after)
		if v := r.peek(); v.State != breaker.Closed || v.RampPermille != s.want {
			t.Fatalf("+%v: %+v, want ramp %d", s.after, v, s.want)
		}
	}
	if st := r.status(); st.RampPercent != nil {
		t.Fatalf("the ramp did not end: %v", *st.RampPercent)
	}
	// A new ramp, ended by an open.
	r.halfOpenNow()
	adm, _ = r.acquire(false)
	r.record(adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200})
	if st := r.status(); st.RampPercent == nil || *st.RampPercent != 10 {
		t.Fatalf("status while ramping: %+v", st)
	}
	r.fail()
	if v := r.peek(); v.State != breaker.Open || v.RampPermille != 0 {
		t.Fatalf("an open during the ramp: %+v", v)
	}
	// Force-close starts no ramp.
	r.forceClose()
	if v := r.peek(); v.RampPermille != 0 {
		t.Fatalf("force-close started a ramp: %+v", v)
	}
}
