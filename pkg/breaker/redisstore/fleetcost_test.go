package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestFleetCostFigures prints what one replica costs Redis, on one server
// and on a three-master Cluster: commands per second at idle with 5,000
// breakers, at 1,000 decisions a second, and the time to install 5,000
// breakers and load their first snapshot. A measurement, not a check:
// FUSEBOX_FIGURES=1 runs it (make bench-replicas).
func TestFleetCostFigures(t *testing.T) {
	if os.Getenv("FUSEBOX_FIGURES") == "" {
		t.Skip("FUSEBOX_FIGURES=1 prints what a replica costs Redis")
	}
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t)
	for _, topo := range []struct {
		name string
		dial dialer
	}{{"one server", serverDialer(srv)}, {"cluster (3 masters)", urlDialer(cl.URL())}} {
		const n = 5000
		start := time.Now()
		st, keys, cc := manyBreakers(t, topo.dial, "cost:", n, nil) // the default 2 s refresh
		loaded := time.Since(start)
		cc.take()
		const idle = 6 * time.Second
		time.Sleep(idle)
		byName, total := cc.take()
		t.Logf("%-20s install + first snapshot of %d breakers: %v", topo.name, n, loaded.Round(time.Millisecond))
		t.Logf("%-20s idle, %d breakers: %.2f commands/s (%s); the full refresh every 30 min adds %.2f/s on average",
			topo.name, n, float64(total)/idle.Seconds(), names(byName), float64(n)/(30*60))
		// 1,000 decisions a second, each recorded (a success), spread over
		// the breakers.
		ctx := context.Background()
		tick := time.NewTicker(time.Millisecond)
		const busy = 3 * time.Second
		end := time.Now().Add(busy)
		decisions := 0
		for time.Now().Before(end) {
			<-tick.C
			k := keys[decisions%len(keys)]
			now := time.Now().UnixNano()
			st.Peek(ctx, k, now)
			adm, _, _ := st.Acquire(ctx, k, now, false)
			_, _ = st.Record(ctx, k, now, adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200})
			decisions++
		}
		tick.Stop()
		time.Sleep(100 * time.Millisecond) // the queued records land
		byName, total = cc.take()
		t.Logf("%-20s %d decisions/s: %.0f commands/s (%s)", topo.name, int(float64(decisions)/busy.Seconds()),
			float64(total)/busy.Seconds(), names(byName))
		if topo.name == "one server" {
			// Memory: one breaker's key after outcomes in both windows,
			// and the server's whole growth over the 5,000.
			c := srv.Client(t)
			k := st.Key(breaker.RouteID("gw", "p0:r:m"))
			for range 50 {
				adm, _, _ := st.Acquire(ctx, keys[0], time.Now().UnixNano(), false)
				_, _ = st.Record(ctx, keys[0], time.Now().UnixNano(), adm, fail503)
				time.Sleep(time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			one, _ := c.MemoryUsage(ctx, k).Result()
			info, _ := c.Info(ctx, "memory").Result()
			t.Logf("%-20s memory: one breaker's key %d bytes after 50 failures; used_memory with %d breakers: %s",
				topo.name, one, n, infoField(info, "used_memory_human"))
		}
	}
	// A second install of 5,000 new breakers on a running replica: the
	// install itself, and until the first snapshot of every one is read.
	st, _, cc := manyBreakers(t, serverDialer(srv), "cost2:", 1, nil)
	cc.take()
	specs := make([]breaker.Spec, 5000)
	for i := range specs {
		specs[i] = breaker.Spec{ID: breaker.RouteID("gw", fmt.Sprintf("n%d:r:m", i)), Policy: replicaPolicy(nil)}
	}
	start := time.Now()
	if _, _, err := st.Install(context.Background(), time.Now().UnixNano(), specs); err != nil {
		t.Fatal(err)
	}
	installed := time.Since(start)
	snaps := 0
	for snaps < len(specs) && time.Since(start) < 10*time.Second {
		time.Sleep(time.Millisecond)
		byName, _ := cc.take()
		snaps += byName["evalsha snap"]
	}
	t.Logf("%-20s 5000 new breakers on a running replica: Install %v, every first snapshot read %v",
		"one server", installed.Round(time.Microsecond), time.Since(start).Round(time.Millisecond))
}

func names(m map[string]int) string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}
