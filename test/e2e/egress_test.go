package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// Whose failure is it (R-FD2, R-FD3): two pods, each an Envoy with its
// own fusebox, sharing one Redis. Pod A's egress to OpenAI is broken (its
// cluster's address refuses connections: what a pod on a bad node, a full
// conntrack table or a broken egress proxy sees), pod B's works. Pod A
// routes around OpenAI on its own after failure_threshold connection
// failures, pod B keeps using it, and no client of either sees an error
// (failover retries each refused attempt on the next route). Then pod B's
// egress breaks too: two replicas saw local failures, the quorum holds,
// and OpenAI opens for the fleet. Before, pod A's three refused attempts
// opened OpenAI for every pod.
func TestOnePodsBrokenEgressOpensThatPodOnly(t *testing.T) {
	w := newFleet(t, 2, "envoy: {failover: true}\n"+fuseboxConfig)
	const route = "openai:us-east:gpt-4o-mini"
	admins := w.adminAddrs()
	for _, a := range admins {
		eventually(t, "two replicas alive on "+a, func() bool { return gauge(t, a, "fusebox_replicas_alive") == 2 })
	}
	dead := freeAddr(t) // nothing listens there: connection refused
	pod := func(replica string, openaiAddr string) *envoysim.Proxy {
		cfg := w.failoverConfig()
		cfg.ExtProc.Addr, cfg.Failover.Attempt.Addr = replica, replica
		if cfg.AccessLog != nil {
			cfg.AccessLog.Addr = replica
		}
		if openaiAddr != "" {
			c := *cfg.Clusters["openai_us"]
			c.Addr = openaiAddr
			cfg.Clusters["openai_us"] = &c
		}
		return w.startProxy(cfg)
	}
	podA := pod(w.grpcAddr, dead)
	podB := pod(w.replicas[0].grpcAddr, "")
	toOpenAI := func(p *envoysim.Proxy) int {
		n := 0
		for _, a := range p.Attempts() {
			if a.Cluster == "openai_us" {
				n++
			}
		}
		return n
	}
	// Envoy tells fusebox of a refused attempt in its access log entry,
	// after the client has its answer (failover_test.go): each request
	// waits until pod A's fusebox counted the refusals so far, so that the
	// next one is decided on them. Before, the test allowed one attempt
	// more and sent the next request at once; on a loaded CI machine two
	// entries were still on their way and pod A sent 5.
	localFailures := `aig_circuit_breaker_outcomes_total{class="failure",gateway="failover",origin="local",reason="connection_error",route="` + route + `"}`
	sent := 0 // Attempts() hands over the attempts since its last call
	for i := range 8 {
		if r := chat(t, podA, gpt, i%2 == 0); r.status != 200 || r.servedBy() != "azure_eu" {
			t.Fatalf("pod A request %d: %d from %q: %s", i, r.status, r.servedBy(), r.body)
		}
		sent += toOpenAI(podA)
		w.eventuallyLive(fmt.Sprintf("pod A's fusebox counted the %d refusals, request %d", sent, i),
			func() bool { return gauge(t, admins[0], localFailures) >= float64(sent) },
			func() string {
				m := scrapeAddr(t, admins[0])
				return fmt.Sprintf(": %v counted\n%s\n%s", gauge(t, admins[0], localFailures), grepLines(m, "outcomes_total"), grepLines(m, "decision_events"))
			})
	}
	// Pod A's fusebox holds OpenAI open for pod A alone, at its threshold.
	if n := sent; n != 3 {
		t.Fatalf("pod A sent %d attempts to its unreachable OpenAI, want failure_threshold=3", n)
	}
	eventually(t, "pod A's replica-scoped open", func() bool {
		return gauge(t, admins[0], `fusebox_replica_scoped_open{gateway="failover",route="`+route+`"}`) == 1
	})
	b := adminBreaker(t, admins[0], "failover", route)
	rs, _ := b["replica_scope"].(map[string]any)
	if b == nil || b["state"] != "closed" || rs == nil || rs["state"] != "open" || rs["reason"] != "connection_error" {
		t.Fatalf("pod A's status of %s: %v, want closed for the fleet with replica_scope open (connection_error)", route, b)
	}
	if b := adminBreaker(t, admins[1], "failover", route); b != nil {
		t.Fatalf("pod B's fusebox reports %s as %v: one pod's egress opened it for the fleet", route, b)
	}
	// Pod B keeps using OpenAI.
	podB.Attempts()
	for i := range 6 {
		if r := chat(t, podB, gpt, i%2 == 0); r.status != 200 || r.servedBy() != "openai_us" {
			t.Fatalf("pod B request %d: %d from %q", i, r.status, r.servedBy())
		}
	}
	// Pod B's egress breaks too (its Envoy reloaded with the same refusing
	// address): the quorum of two holds, and OpenAI opens for everyone.
	podB2 := pod(w.replicas[0].grpcAddr, dead)
	for i := range 8 {
		if r := chat(t, podB2, gpt, i%2 == 0); r.status != 200 || r.servedBy() != "azure_eu" {
			t.Fatalf("pod B (broken) request %d: %d from %q: %s", i, r.status, r.servedBy(), r.body)
		}
	}
	for _, a := range admins {
		eventually(t, "OpenAI open for the fleet on "+a, func() bool {
			b := adminBreaker(t, a, "failover", route)
			return b != nil && b["state"] == "open"
		})
	}
	podB.Attempts()
	for i := range 4 {
		if r := chat(t, podB, gpt, false); r.status != 200 || r.servedBy() != "azure_eu" {
			t.Fatalf("pod B (healthy egress) after the fleet's open, request %d: %d from %q", i, r.status, r.servedBy())
		}
	}
	if n := toOpenAI(podB); n != 0 {
		t.Fatalf("pod B still sent %d attempts to OpenAI after the fleet opened it", n)
	}
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// gauge reads one series from an admin listener's /metrics (-1: absent).
func gauge(t *testing.T, addr, series string) float64 {
	t.Helper()
	re := regexp.MustCompile("(?m)^" + regexp.QuoteMeta(series) + ` (\S+)$`)
	g := re.FindStringSubmatch(scrapeAddr(t, addr))
	if g == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(g[1], 64)
	return v
}
