package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// R-DL11: a record under a key is applied at most once while the key lives;
// a repeat answers AlreadyApplied and changes nothing, whichever admission
// it carries. Keys are per breaker, neithers carry none, and a key whose
// life ended applies again.
func testKeyedRecordsApplyOnce(t *testing.T, f Factory) {
	fail := func(key string) breaker.Result {
		return breaker.Result{Kind: breaker.KindStatus, Status: 503, Key: key, KeyLifeMs: 60_000}
	}
	cases := []struct {
		name string
		// sends are the keys of the failures sent, in order ("" unkeyed).
		sends      []string
		wantState  breaker.State
		wantRepeat int
	}{
		{"one request counted by two channels", []string{"d1:1", "d1:1"}, breaker.Closed, 1},
		{"the same request three times over", []string{"d1:1", "d1:1", "d1:1"}, breaker.Closed, 2},
		{"two attempts of one decision", []string{"d1:1", "d1:2"}, breaker.Open, 0},
		{"two decisions", []string{"d1:1", "d2:1"}, breaker.Open, 0},
		{"unkeyed records always apply", []string{"", ""}, breaker.Open, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 2 }))
			repeats := 0
			for _, k := range c.sends {
				rec := r.send(fail(k))
				if rec.AlreadyApplied {
					repeats++
					if rec.Applied {
						t.Fatalf("%s: a repeat says it was applied", k)
					}
				} else if !rec.Applied {
					t.Fatalf("%s: a first record not applied: %+v", k, rec)
				}
			}
			if repeats != c.wantRepeat {
				t.Fatalf("repeats = %d, want %d", repeats, c.wantRepeat)
			}
			if got := r.state(); got != c.wantState {
				t.Fatalf("state = %v, want %v", got, c.wantState)
			}
		})
	}

	t.Run("a repeat frees the probe slot it holds and closes nothing", func(t *testing.T) {
		r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 2; p.HalfOpenMaxProbes = 1 }))
		r.halfOpenNow()
		adm, ok := r.acquire(false)
		if !ok {
			t.Fatal("no probe slot")
		}
		ok200 := breaker.Result{Kind: breaker.KindAnswered, Status: 200, Key: "p:1"}
		if rec := r.record(adm, ok200); !rec.Applied {
			t.Fatalf("the probe's record: %+v", rec)
		}
		r.openNow()
		r.advance(time.Duration(r.p.CooldownMs) * time.Millisecond)
		adm, ok = r.acquire(false)
		if !ok {
			t.Fatal("no probe slot in the second half-open")
		}
		if rec := r.record(adm, ok200); !rec.AlreadyApplied {
			t.Fatalf("the repeat was applied: %+v", rec)
		}
		if r.state() != breaker.HalfOpen {
			t.Fatalf("a repeated success closed the breaker: %v", r.state())
		}
		if _, ok := r.acquire(false); !ok {
			t.Fatal("the repeat kept its probe slot")
		}
	})

	t.Run("a key applies again once its life ended", func(t *testing.T) {
		r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 100 }))
		res := breaker.Result{Kind: breaker.KindStatus, Status: 503, Key: "old:1", KeyLifeMs: 1000}
		r.send(res)
		r.advance(5 * time.Second)
		if rec := r.send(res); rec.AlreadyApplied {
			t.Fatal("a key past twice its life still answered already_applied")
		}
	})

	t.Run("many keys", func(t *testing.T) {
		r := newRig(t, f, pol(func(p *breaker.Policy) { p.FailureThreshold = 1 << 20 }))
		ok := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
		for i := 0; i < 300; i++ {
			ok.Key = fmt.Sprintf("d%d:1", i)
			r.send(ok)
		}
		for i := 0; i < 300; i += 7 {
			ok.Key = fmt.Sprintf("d%d:1", i)
			if rec := r.send(ok); !rec.AlreadyApplied {
				t.Fatalf("key %d of 300 forgotten", i)
			}
		}
	})
}
