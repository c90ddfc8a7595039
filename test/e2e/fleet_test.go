package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// A fleet: several fusebox replicas on one Redis behind one Envoy, as
// compose and Kubernetes run them. Envoy's round robin sends each ext_proc
// stream (and each access log worker's stream) to the next replica
// (docs/envoy.md, "Several fusebox replicas").

// replica is a fusebox process of the fleet after the first.
type replica struct {
	grpcAddr string
	in       *mainlib.Instance
	cancel   context.CancelFunc
}

func (r *replica) stop() {
	r.cancel()
	_ = r.in.Wait()
}

// withRedis runs the world's fusebox on a fresh redis-server.
func withRedis(w *world) {
	srv := redistest.Start(w.t)
	w.args = append(w.args, "-redis-url", "redis://"+srv.Addr+"/0")
}

// scenarioRedisStore is the store section of the e2e worlds on Redis: the
// fleet key, and an op timeout of scenarioOpTimeoutMs. As startProxy lifts
// Envoy's message timeouts, this lifts the store's 50 ms: these scenarios
// judge what fusebox decides, and on a busy 2-core machine under -race a
// Redis call missed 50 ms and the replica went on on its local state for
// the 2 s before its next try (loaded runs: a poison request judged on a
// replica that could not read the fleet's ledger, a fleet failover's
// meeting resent). What a replica does across a blip is the Redis
// store's tests' and the soak's to judge (stalls, restarts, FLUSHALL).
func scenarioRedisStore(keyFile string) string {
	return fmt.Sprintf("store: {redis: {hmac_key_file: %q, op_timeout_ms: %d}}", keyFile, scenarioOpTimeoutMs)
}

const scenarioOpTimeoutMs = 2000

// newFleet is a world of n replicas sharing one Redis and the world's
// clock (one clock stands for replicas whose clocks agree).
func newFleet(t *testing.T, n int, config string) *world {
	t.Helper()
	return newFleetOn(t, n, config, true)
}

// newFleetOn is newFleet on Redis, or (onRedis false) n replicas each on
// its own memory store, sharing nothing but the Envoy in front.
func newFleetOn(t *testing.T, n int, config string, onRedis bool) *world {
	t.Helper()
	var opts []func(*world)
	if onRedis {
		// A fleet key (store.redis.hmac_key_file): it signs what replicas
		// share, and seals the attempt token every replica must open.
		key := filepath.Join(t.TempDir(), "fleet.key")
		if err := os.WriteFile(key, []byte(strings.Repeat("k", 32)), 0o600); err != nil {
			t.Fatal(err)
		}
		config = strings.Replace(config, "policies:", scenarioRedisStore(key)+"\npolicies:", 1)
		opts = append(opts, withRedis)
	}
	w := newWorldConfig(t, config, opts...)
	for range n - 1 {
		addr := freeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		in, err := mainlib.Start(ctx, append([]string{"-config", w.cfgPath, "-grpc-addr", addr, "-admin-addr", "127.0.0.1:0", "-grace-period", "0s"}, w.args...),
			w.logs, mainlib.WithClock(w.clk), mainlib.WithOverlayCache(""))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		w.replicas = append(w.replicas, &replica{grpcAddr: addr, in: in, cancel: cancel})
	}
	return w
}

// fleetHosts sets every fusebox filter and the access log to the whole
// fleet.
func (w *world) fleetHosts(cfg *envoysim.Config) {
	var more []string
	for _, r := range w.replicas {
		more = append(more, r.grpcAddr)
	}
	cfg.ExtProc.Addrs = more
	if cfg.Observer != nil {
		cfg.Observer.Addrs = more
	}
	if cfg.Failover != nil {
		cfg.Failover.Attempt.Addrs = more
	}
	if cfg.AccessLog != nil {
		cfg.AccessLog.Addrs = more
		cfg.AccessLog.Workers = 2
	}
}

// adminAddrs are every replica's admin listeners, the first fusebox's
// first.
func (w *world) adminAddrs() []string {
	out := []string{w.fusebox.AdminAddr()}
	for _, r := range w.replicas {
		out = append(out, r.in.AdminAddr())
	}
	return out
}

// fleetLines is every replica's /metrics lines that contain one of subs:
// what a failed fleet check needs to be understood without a rerun.
func (w *world) fleetLines(subs ...string) string {
	w.t.Helper()
	var b strings.Builder
	for i, a := range w.adminAddrs() {
		fmt.Fprintf(&b, "\nreplica %d (%s):", i, a)
		for _, l := range strings.Split(scrapeAddr(w.t, a), "\n") {
			for _, s := range subs {
				if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
					b.WriteString("\n  " + l)
					break
				}
			}
		}
	}
	return b.String()
}

// fleetSum adds up a counter series over every replica's /metrics.
func (w *world) fleetSum(series string) float64 {
	w.t.Helper()
	re := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(series) + ` (\S+)$`)
	var sum float64
	for _, a := range w.adminAddrs() {
		m := scrapeAddr(w.t, a)
		if g := re.FindStringSubmatch(m); g != nil {
			v, _ := strconv.ParseFloat(g[1], 64)
			sum += v
		}
	}
	return sum
}

// TestFleetFailoverMeetsAcrossReplicas (R-X7): two replicas behind one
// envoysim in the failover deployment; the first route refuses
// connections. Attempt 1 of each request lands on one replica, attempt 2
// on the other, yet each refused connection counts once, as a
// connection_error, the breaker opens after failure_threshold of them on
// both replicas, and nothing becomes a neither. Before the meeting went
// through the store, the replica that parked attempt 1 never heard of
// attempt 2: every refusal became a neither after the park time, and the
// breaker never opened.
func TestFleetFailoverMeetsAcrossReplicas(t *testing.T) {
	// One Envoy's refusals, whichever replica claims them: its egress is
	// the one that failed, so they count for the fleet at once (quorum 1).
	// At the default quorum of 2 the breaker opened for the fleet only
	// when the claims happened to fall on both replicas; a loaded run put
	// all three on one, which opened its own view alone (R-FD2).
	config := strings.Replace(fuseboxConfig, "standard: {enabled: true,", "standard: {enabled: true, local_origin_quorum: 1,", 1)
	w := newFleet(t, 2, "envoy: {failover: true}\n"+config)
	cfg := w.failoverConfig()
	w.fleetHosts(&cfg)
	p := w.startProxy(cfg)
	w.providers["openai_us"].Down()
	for i := range 3 {
		if r := chat(t, p, gpt, false); r.status != 200 || r.servedBy() != "azure_eu" {
			t.Fatalf("request %d: %d from %q", i, r.status, r.servedBy())
		}
	}
	connErr := `aig_circuit_breaker_outcomes_total{class="failure",gateway="failover",origin="local",reason="connection_error",route="openai:us-east:gpt-4o-mini"}`
	w.eventuallyLive("three connection errors, across the fleet", func() bool { return w.fleetSum(connErr) == 3 },
		func() string {
			return w.fleetLines(`openai:us-east`, `fusebox_decision_events_total`, `fusebox_store_`)
		})
	for _, a := range w.adminAddrs() {
		eventually(t, "open on replica "+a, func() bool {
			b := adminBreaker(t, a, "failover", "openai:us-east:gpt-4o-mini")
			return b["state"] == "open" && b["reason"] == "connection_error"
		})
	}
	for _, r := range []string{"client_cancel", "no_outcome"} {
		if n := w.fleetSum(`aig_circuit_breaker_outcomes_total{class="neither",gateway="failover",origin="",reason="` + r + `",route="openai:us-east:gpt-4o-mini"}`); n != 0 {
			t.Fatalf("%v refusals became a neither (%s)", n, r)
		}
	}
	if got := w.fleetSum(connErr); got != 3 {
		t.Fatalf("%v connection errors, want 3 (each refusal once)", got)
	}
	// Streams really went to both replicas.
	for _, a := range w.adminAddrs() {
		if !regexp.MustCompile(`aig_extproc_message_duration_seconds_count\{phase="request_headers"\} [1-9]`).MatchString(scrapeAddr(t, a)) {
			t.Fatalf("replica %s served no stream", a)
		}
	}
}

func scrapeAddr(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func adminBreaker(t *testing.T, addr, gateway, route string) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/admin/v1/gateways/" + gateway + "/circuit-breaker")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v[route]
}
