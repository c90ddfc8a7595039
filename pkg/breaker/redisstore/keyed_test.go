package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestOneRequestCountsOnceAcrossABlip (#49, R-DL11, R-DL12): the observer on
// replica a records a request's failure while Redis answers too late (the
// script runs, the reply is lost: unknown), and the access log entry for the
// same request reaches replica b, which records it straight away. With
// threshold 2 the route must stay closed with one failure, through a's
// resend after the blip. Before keyed records, the two copies counted twice
// and one request opened the route (3 of 3 runs from outside).
func TestOneRequestCountsOnceAcrossABlip(t *testing.T) {
	for _, c := range []struct {
		name string
		// lost: a's answer is lost (Redis ran it); else a's call never
		// reaches Redis (refused before it ran) and a resends it later.
		lost bool
	}{{"the answer lost after the script ran", true}, {"the call refused before it ran", false}} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			px := srv.Proxy(t)
			clk := breaker.NewFakeClock(time.Now())
			// A timeout is a local failure: with quorum 1 it counts for
			// every replica at once (quorum_test.go holds the quorum).
			p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold, p.LocalOriginQuorum = 2, 1 })
			a := replicasWith(t, proxiedClient(t, px), "keyed:", clk, p, 1, 100*time.Millisecond, nil)[0]
			b := replicasWith(t, srv.Client(t), "keyed:", clk, p, 1, time.Second, func(_ int, o *redisstore.Options) {
				o.ReplicaID = "b"
			})[0]
			ctx := context.Background()
			now := func() int64 { return clk.Now().UnixNano() }
			status := func() breaker.Status {
				s, err := b.st.Status(ctx, b.key, now())
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			for range 3 { // a warm connection: the record is sent at once
				if _, err := a.st.Status(ctx, a.key, now()); err != nil {
					t.Fatal(err)
				}
			}
			res := breaker.Result{Kind: breaker.KindTimeout, Status: 504, Key: "5f3a9c:1"}
			if c.lost {
				px.Latency(0, 300*time.Millisecond)
			} else {
				px.Blackhole(true)
			}
			if _, err := a.st.Record(ctx, a.key, now(), breaker.Admission{Gen: 1}, res); err != nil {
				t.Fatal(err)
			}
			eventually(t, "a's record timed out", func() bool { return a.st.Degraded() })
			if c.lost {
				eventually(t, "the lost call ran in Redis", func() bool { return status().Failures == 1 })
			}
			if _, err := b.st.Record(ctx, b.key, now(), breaker.Admission{Gen: 1}, res); err != nil {
				t.Fatal(err)
			}
			eventually(t, "b's record in Redis", func() bool { return status().Failures == 1 })
			px.Latency(0, 0)
			px.Blackhole(false)
			// The resync writes back what Redis did not take before it
			// reads the breaker back: once a is not degraded, its resend
			// has landed.
			eventually(t, "a's resync", func() bool { return !a.st.Degraded() })
			if s := status(); s.State != "closed" || s.Failures != 1 {
				t.Fatalf("one request, two channels: Redis has %s with %d failures", s.State, s.Failures)
			}
			// A second, different request is what opens it.
			res.Key = "77e0d1:1"
			if _, err := b.st.Record(ctx, b.key, now(), breaker.Admission{Gen: 1}, res); err != nil {
				t.Fatal(err)
			}
			eventually(t, "open on the second request", func() bool { return status().State == "open" })
		})
	}
}

// TestARepeatAnswersAlreadyApplied (R-DL11): on the synchronous path, the
// second record of a key that another replica applied answers
// AlreadyApplied and is not applied.
func TestARepeatAnswersAlreadyApplied(t *testing.T) {
	srv := redistest.Start(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 2 })
	rs := replicasWith(t, srv.Client(t), "keyedsync:", clk, p, 2, time.Second, func(_ int, o *redisstore.Options) {
		o.AsyncRecord = false
	})
	ctx := context.Background()
	res := breaker.Result{Kind: breaker.KindStatus, Status: 503, Key: "ab12:2"}
	first, err := rs[0].st.Record(ctx, rs[0].key, clk.Now().UnixNano(), breaker.Admission{Gen: 1}, res)
	if err != nil || !first.Applied || first.AlreadyApplied {
		t.Fatalf("first: %+v %v", first, err)
	}
	second, err := rs[1].st.Record(ctx, rs[1].key, clk.Now().UnixNano(), breaker.Admission{Gen: 1}, res)
	if err != nil || second.Applied || !second.AlreadyApplied {
		t.Fatalf("second: %+v %v", second, err)
	}
	if s, _ := rs[1].st.Status(ctx, rs[1].key, clk.Now().UnixNano()); s.Failures != 1 {
		t.Fatalf("failures = %d, want 1", s.Failures)
	}
}
