package redisstore_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestFaultFigures measures decisions (Peek, then Acquire: a half-open
// breaker takes its probe slot in Redis) under each Redis fault, through
// the fault proxy, and prints p50/p99/max. It is a measurement, not a
// check: FUSEBOX_FIGURES=1 runs it (make bench-replicas).
func TestFaultFigures(t *testing.T) {
	if os.Getenv("FUSEBOX_FIGURES") == "" {
		t.Skip("FUSEBOX_FIGURES=1 prints the decision latency under each Redis fault")
	}
	faults := []struct {
		name       string
		on, off    func(px *redistest.Proxy, srv *redistest.Server)
		outcomesOK bool
	}{
		{"healthy", func(*redistest.Proxy, *redistest.Server) {}, func(*redistest.Proxy, *redistest.Server) {}, true},
		{"5 ms per direction", func(px *redistest.Proxy, _ *redistest.Server) { px.Latency(5*time.Millisecond, 5*time.Millisecond) },
			func(px *redistest.Proxy, _ *redistest.Server) { px.Latency(0, 0) }, true},
		{"stalled (2 s)", func(px *redistest.Proxy, _ *redistest.Server) { px.Stall(true) },
			func(px *redistest.Proxy, _ *redistest.Server) { px.Stall(false) }, false},
		{"blackholed", func(px *redistest.Proxy, _ *redistest.Server) { px.Blackhole(true) },
			func(px *redistest.Proxy, _ *redistest.Server) { px.Blackhole(false) }, false},
	}
	for _, f := range faults {
		srv := redistest.Start(t)
		px := srv.Proxy(t)
		client, err := redisstore.NewClient("redis://" + px.Addr + "/0")
		if err != nil {
			t.Fatal(err)
		}
		clk := breaker.NewFakeClock(time.Now())
		p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1; p.CooldownMs = 1000; p.HalfOpenMaxProbes = 0 })
		st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "fig:", OpTimeout: 50 * time.Millisecond, Clock: clk, AsyncRecord: true})
		ctx, cancel := context.WithCancel(context.Background())
		half := breaker.RouteID("gw", "half:r:m")
		keys, _, _ := st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}, {ID: half, Policy: p}})
		wg := st.Start(ctx)
		eventually(t, "ready", st.Ready)
		adm, _, _ := st.Acquire(ctx, keys[1], clk.Now().UnixNano(), false)
		_, _ = st.Record(ctx, keys[1], clk.Now().UnixNano(), adm, fail503)
		time.Sleep(50 * time.Millisecond)
		clk.Advance(2 * time.Second) // keys[1] half-open: each Acquire is a script call
		f.on(px, srv)
		var lat []time.Duration
		start := time.Now()
		for i := 0; time.Since(start) < 2*time.Second; i++ {
			k := keys[i%2]
			t0 := time.Now()
			st.Peek(ctx, k, clk.Now().UnixNano())
			_, _, _ = st.Acquire(ctx, k, clk.Now().UnixNano(), false)
			lat = append(lat, time.Since(t0))
		}
		f.off(px, srv)
		slices.Sort(lat)
		t.Logf("%-20s decisions %6d  p50 %9s  p99 %9s  max %9s", f.name, len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
		cancel()
		wg.Wait()
		client.Close()
	}
}
