package replay

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// fdCfg is cfg with the R-FD policy fields to vary.
const fdCfg = `
gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 30000, local_origin_quorum: QUORUM, request_fault_ttl_sec: TTL}
    models:
      - {name: m, routes: ["a:r:m", "b:r:m"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "b:r:m", cluster: cb}
`

// fdLine is one line of route a: ok, a refused connection (UF, no answer:
// local), or a 500 (upstream); of replica, with fingerprint fp (none: "")
// and again.
type fdLine struct {
	sec     int
	kind    string // "ok", "uf", "500"
	replica string
	fp      string
	again   bool
}

func fdLog(t *testing.T, lines []fdLine) *Log {
	t.Helper()
	var b bytes.Buffer
	for i, l := range lines {
		code, flags, details, outcome, reason := 200, "-", "via_upstream", "success", "success"
		switch l.kind {
		case "uf":
			code, flags, details, outcome, reason = 503, "UF", "upstream_reset_before_response_started{connection_failure}", "failure", "connection_error"
		case "500":
			code, outcome, reason = 500, "failure", "provider_5xx"
		}
		extra := ""
		if l.replica != "" {
			extra += fmt.Sprintf(`,"replica":%q`, l.replica)
		}
		if l.fp != "" {
			extra += fmt.Sprintf(`,"fp":%q`, l.fp)
		}
		if l.again {
			extra += `,"again":true`
		}
		fmt.Fprintf(&b, `{"start_time":"%d.000","duration_ms":12,"ttfb_ms":9,"code":%d,"flags":%q,"details":%q,"cluster":"ca","attempts":1,"gateway":"default","route":"a:r:m","fusebox":{"decision":"d%d","model":"m","outcome":%q,"reason":%q%s}}`+"\n",
			1764590400+l.sec, code, flags, details, i, outcome, reason, extra)
	}
	log := &Log{}
	if err := log.read("test", bytes.NewReader(b.Bytes())); err != nil {
		t.Fatal(err)
	}
	if log.Malformed != 0 {
		t.Fatalf("malformed: %v", log.Examples)
	}
	log.sort()
	return log
}

func fdRun(t *testing.T, quorum, ttl string, log *Log) (*Report, string) {
	t.Helper()
	rt, err := routes.Parse([]byte(strings.NewReplacer("QUORUM", quorum, "TTL", ttl).Replace(fdCfg)), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := Run(rt, log)
	var text bytes.Buffer
	(&Result{Candidate: rep}).WriteText(&text)
	return rep, text.String()
}

// TestReplayHoldsOneReplicasLocalFailures (R-FD5, R-FD2, R-FD3): one pod's
// refused connections, while another pod reaches the provider, are held
// for a quorum of replicas: they open that pod's own view of the route
// (its later requests go elsewhere) and never the route; with quorum 1,
// or when the second pod fails too, the route opens. Before, replay
// counted every local failure for the route, and a line named no replica.
func TestReplayHoldsOneReplicasLocalFailures(t *testing.T) {
	onePod := []fdLine{}
	for i := 0; i < 20; i++ {
		onePod = append(onePod, fdLine{sec: i, kind: "ok", replica: "pod-b"})
		kind := "ok"
		if i >= 5 {
			kind = "uf"
		}
		onePod = append(onePod, fdLine{sec: i, kind: kind, replica: "pod-a"})
	}
	bothPods := append([]fdLine{}, onePod...)
	for i := 10; i < 20; i++ {
		bothPods[2*i] = fdLine{sec: i, kind: "uf", replica: "pod-b"}
	}
	noReplica := []fdLine{}
	for _, l := range onePod {
		l.replica = ""
		noReplica = append(noReplica, l)
	}
	cases := []struct {
		name                             string
		quorum                           string
		lines                            []fdLine
		opens, replicaOpens, heldAtLeast int
		heldAtMost                       int
	}{
		{"one pod's egress, quorum 2: its own view opens, the route never", "2", onePod, 0, 1, 3, 3},
		{"quorum 1: every replica's evidence counts at once", "1", onePod, 1, 0, 0, 0},
		{"both pods fail: the quorum is met and the route opens", "2", bothPods, 1, 1, 3, 3},
		{"lines without a replica: one replica, nothing held", "2", noReplica, 1, 0, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep, text := fdRun(t, tc.quorum, "600", fdLog(t, tc.lines))
			a := rep.byKey["default|a:r:m"]
			if a == nil {
				t.Fatal("no report for route a")
			}
			if a.Opens != tc.opens || a.ReplicaOpens != tc.replicaOpens || a.HeldForQuorum < tc.heldAtLeast || a.HeldForQuorum > tc.heldAtMost {
				t.Fatalf("opens %d replica opens %d held %d, want %d %d %d..%d\n%s", a.Opens, a.ReplicaOpens, a.HeldForQuorum,
					tc.opens, tc.replicaOpens, tc.heldAtLeast, tc.heldAtMost, text)
			}
			if a.LocalFailures == 0 || a.UpstreamFailures != 0 {
				t.Fatalf("local %d upstream %d", a.LocalFailures, a.UpstreamFailures)
			}
			if tc.replicaOpens > 0 {
				if !strings.Contains(text, "closed->open (connection_error, local, replica pod-a)") || !strings.Contains(text, "local failures (held for a quorum)") {
					t.Fatalf("the text lacks the replica's open or the table:\n%s", text)
				}
				// pod-a's later requests went to b, pod-b's stayed on a.
				if b := rep.byKey["default|b:r:m"]; b == nil || b.Served == 0 {
					t.Fatalf("pod-a's requests were not routed around a: %+v", b)
				}
			}
		})
	}
}

// TestReplayJudgesRequestFaults (R-FD5, R-FD4): a poison request that an
// SDK retries twice, while route a answers others, opens no route in the
// replay, with the ledger live uses; request_fault_ttl_sec 0 counts it,
// and the same 500s for every request (an outage) still open the route.
// Before, replay counted every failure for its route, and a live
// request_fault neither stayed a neither whatever the candidate.
func TestReplayJudgesRequestFaults(t *testing.T) {
	const poison = "00112233aabbccdd"
	warm := []fdLine{}
	for i := 0; i < 6; i++ {
		warm = append(warm, fdLine{sec: i, kind: "ok", fp: fmt.Sprintf("%016x", i+1)})
	}
	retried := append(append([]fdLine{}, warm...),
		fdLine{sec: 10, kind: "500", fp: poison}, fdLine{sec: 11, kind: "500", fp: poison, again: true},
		fdLine{sec: 12, kind: "500", fp: poison, again: true}, fdLine{sec: 13, kind: "ok", fp: "0000000000000099"})
	outage := append([]fdLine{}, warm...)
	for i := 0; i < 4; i++ {
		fp := fmt.Sprintf("%016x", 100+i)
		outage = append(outage, fdLine{sec: 10 + 2*i, kind: "500", fp: fp}, fdLine{sec: 11 + 2*i, kind: "500", fp: fp, again: true})
	}
	noFP := []fdLine{}
	for _, l := range retried {
		l.fp = ""
		noFP = append(noFP, l)
	}
	cases := []struct {
		name          string
		ttl           string
		lines         []fdLine
		opens, faults int
	}{
		{"a poison request retried twice opens nothing", "600", retried, 0, 2},
		{"request_fault_ttl_sec 0: not judged", "0", retried, 1, 0},
		{"an outage: every request fails, each retried (the first retries pass the guard)", "600", outage, 1, 2},
		{"lines without a fingerprint: not judged", "600", noFP, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep, text := fdRun(t, "2", tc.ttl, fdLog(t, tc.lines))
			a := rep.byKey["default|a:r:m"]
			if a == nil || a.Opens != tc.opens || a.RequestFaults != tc.faults {
				t.Fatalf("%+v\n%s", a, text)
			}
			if tc.faults > 0 && !strings.Contains(text, "upstream failures (the request's own)") {
				t.Fatalf("the text lacks the table:\n%s", text)
			}
		})
	}
}

// TestAliveCountsRecentReplicas: a replica counts alive for 15 s after
// its last line, as its beat does in the store.
func TestAliveCountsRecentReplicas(t *testing.T) {
	d := newDomains(&engine{}, nil)
	const s = int64(1e9)
	d.saw("a", 0)
	d.saw("b", 10*s)
	for _, tc := range []struct {
		at   int64
		want int
	}{{0, 2}, {14 * s, 2}, {15 * s, 1}, {25 * s, 1}, {26 * s, 1}} {
		if got := d.alive(tc.at); got != tc.want {
			t.Errorf("at %ds: %d alive, want %d", tc.at/s, got, tc.want)
		}
	}
}
