package replay

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

const cfg = `
gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_threshold: 3, window_sec: 60, cooldown_ms: 30000}
    models:
      - {name: m, routes: ["a:r:m", "b:r:m"]}
    routes:
      - {key: "a:r:m", cluster: ca}
      - {key: "b:r:m", cluster: cb}
`

// synthetic writes n lines, one a second: route a answers 503 from
// failAt on, everything else 200.
func synthetic(n, failAt int) []byte {
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		code, outcome, reason := 200, "success", "success"
		if i >= failAt {
			code, outcome, reason = 503, "failure", "provider_5xx"
		}
		fmt.Fprintf(&b, `{"start_time":"%d.000","duration_ms":12,"ttfb_ms":9,"code":%d,"flags":"-","details":"via_upstream","cluster":"ca","attempts":1,"gateway":"default","route":"a:r:m","fusebox":{"decision":"d%d","model":"m","outcome":%q,"reason":%q}}`+"\n",
			1764590400+i, code, i, outcome, reason)
	}
	return b.Bytes()
}

// A change of threshold moves the open: with 3 the breaker opens at the
// third failure, with 5 at the fifth. Malformed lines are counted and
// skipped; gzip is read as well as plain text.
func TestThresholdMovesTheOpen(t *testing.T) {
	raw := append(synthetic(20, 10), []byte("not json\n{\"start_time\":\"-\"}\n")...)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "log.gz")
	if err := os.WriteFile(path, gz.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := ReadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Lines) != 20 || log.Malformed != 2 {
		t.Fatalf("%d lines, %d malformed", len(log.Lines), log.Malformed)
	}
	for _, tc := range []struct {
		threshold string
		openAt    float64
	}{{"3", 1764590400 + 12.012}, {"5", 1764590400 + 14.012}} { // each outcome at its end: start + 12 ms
		rt, err := routes.Parse([]byte(strings.Replace(cfg, "failure_threshold: 3", "failure_threshold: "+tc.threshold, 1)), routes.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rep := Run(rt, log)
		a := rep.byKey["default|a:r:m"]
		if a == nil || len(a.Transitions) == 0 || a.Transitions[0].Change != "closed->open" || a.Transitions[0].At != tc.openAt {
			t.Fatalf("threshold %s: %+v", tc.threshold, a)
		}
		// After the open the rest goes to b, which never served live:
		// estimated, from b's observed health (none logged: a success).
		if b := rep.byKey["default|b:r:m"]; b == nil || b.Served == 0 || a.Rerouted != b.Served {
			t.Fatalf("threshold %s: rerouted %d, b served %+v", tc.threshold, a.Rerouted, b)
		}
	}
}

// R-R4: replay keeps time as it happened. Requests that time out after
// 10 s, one a second, under threshold 3: live, the third timeout is
// recorded at its end, t+2+10 s, and the breaker opens at t+12 s, while
// the requests started meanwhile went to the route. Replaying the live
// config on its own log gives the same open time and 0 client errors
// avoided or added. Before, each outcome was recorded at its start: the
// open came at t+2 s and 9 client errors were "avoided".
func TestReplayKeepsTimeAsItHappened(t *testing.T) {
	var b bytes.Buffer
	const t0 = 1764590400
	for i := 0; i < 14; i++ {
		code, flags, outcome, reason, dur := 504, "UT", "failure", "timeout", 10000
		if t0+i >= t0+12 {
			code, flags, outcome, reason, dur = 200, "-", "success", "success", 20
		}
		fmt.Fprintf(&b, `{"start_time":"%d.000","duration_ms":%d,"code":%d,"flags":%q,"cluster":"ca","gateway":"default","route":"a:r:m","fusebox":{"decision":"d%d","model":"m","outcome":%q,"reason":%q}}`+"\n",
			t0+i, dur, code, flags, i, outcome, reason)
	}
	log := &Log{}
	if err := log.read("test", &b); err != nil {
		t.Fatal(err)
	}
	log.sort()
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := Run(rt, log)
	a := rep.byKey["default|a:r:m"]
	if a == nil || len(a.Transitions) == 0 || a.Transitions[0].At != t0+12 {
		t.Fatalf("the open: %+v, want at t+12 s", a)
	}
	if rep.Avoided != 0 || rep.Added != 0 {
		t.Fatalf("the live config on its own log: %d avoided, %d added, want 0 and 0", rep.Avoided, rep.Added)
	}
}

// The line parser reads outside input: it never panics, and what it
// accepts has a time.
func FuzzParseLine(f *testing.F) {
	for _, l := range bytes.Split(synthetic(3, 1), []byte("\n")) {
		f.Add(l)
	}
	f.Add([]byte(`{"start_time":1e10,"code":"503","fusebox":"-"}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLine(b)
		if err == nil && l.At < 0 {
			t.Fatalf("accepted a negative time: %+v", l)
		}
	})
}

// Replay speed (R-R2: at least 1M lines a minute on one core): lines per
// second is the figure.
func BenchmarkReplay(b *testing.B) {
	raw := synthetic(100000, 50000)
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		log := &Log{}
		if err := log.read("test", bytes.NewReader(raw)); err != nil {
			b.Fatal(err)
		}
		log.sort()
		Run(rt, log)
	}
	b.ReportMetric(float64(b.N*100000)/b.Elapsed().Seconds(), "lines/s")
}

// Cost: the tokens each line holds times the cost_per_mtok of the route
// the config sends it to; next to the live cost, and estimated where the
// route changed. Client errors avoided and added are counted per request.
func TestCostAndAvoided(t *testing.T) {
	raw := bytes.ReplaceAll(synthetic(20, 10), []byte(`"reason":"`), []byte(`"tokens_in":600000,"tokens_out":400000,"reason":"`))
	log := &Log{}
	if err := log.read("test", bytes.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	priced := strings.Replace(strings.Replace(cfg, `cluster: ca}`, `cluster: ca, cost_per_mtok: 1}`, 1), `cluster: cb}`, `cluster: cb, cost_per_mtok: 3}`, 1)
	rt, err := routes.Parse([]byte(priced), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := Run(rt, log)
	// Live: 20 requests of a million tokens on a (1 per million).
	if rep.LiveCost != 20 || rep.LiveClientErrors != 10 {
		t.Fatalf("live cost %v, errors %d", rep.LiveCost, rep.LiveClientErrors)
	}
	b := rep.byKey["default|b:r:m"]
	if b.Cost != 3*float64(b.Served) || b.CostEstimated != b.Cost || rep.Avoided != b.Served || rep.Added != 0 {
		t.Fatalf("b %+v, avoided %d, added %d", b, rep.Avoided, rep.Added)
	}
}

// resultOf judges a line's flags as the live channels do (R-AL4, R-O15):
// Envoy's own timeouts (UT, SI, UMSDR, DT) are timeouts, and a connection
// failure whose retry overflowed (UF with UO) is that connection failure.
func TestResultOfFlags(t *testing.T) {
	cases := []struct {
		flags string
		kind  breaker.Kind
	}{
		{"UT", breaker.KindTimeout}, {"SI", breaker.KindTimeout}, {"UMSDR", breaker.KindTimeout}, {"DT", breaker.KindTimeout},
		{"UF", breaker.KindConnError}, {"UF,UO", breaker.KindConnError}, {"UO,UC", breaker.KindConnError},
		{"UO", breaker.KindNeither}, {"DC", breaker.KindNeither}, {"DR", breaker.KindNeither},
	}
	for _, tc := range cases {
		if r := resultOf(&Line{Code: 503, Flags: tc.flags}); r.Kind != tc.kind {
			t.Errorf("%s: kind %v, want %v", tc.flags, r.Kind, tc.kind)
		}
	}
}

// Replay judges a line as the access log channel judges its entry (R-AL4):
// a timer that cut a flowing answer is a neither cut_mid_answer, whatever
// the timer (before: a timeout whatever the code); an HTTP/2 client's
// reset (DR) is a client_cancel (before: the provider's status); no
// cluster is cluster_not_found (before: a 503 from the provider).
func TestResultOfAsTheLiveChannelsJudge(t *testing.T) {
	cases := []struct {
		name   string
		line   Line
		kind   breaker.Kind
		reason string
		status int
	}{
		{"route timeout mid-answer", Line{Code: 200, Flags: "UT", Details: "via_upstream"}, breaker.KindNeither, breaker.ReasonCutMidAnswer, 0},
		{"stream idle mid-answer", Line{Code: 200, Flags: "SI", Details: "via_upstream"}, breaker.KindNeither, breaker.ReasonCutMidAnswer, 0},
		{"route timeout before headers", Line{Code: 504, Flags: "UT", Details: "upstream_response_timeout"}, breaker.KindTimeout, "", 0},
		{"HTTP/2 client reset", Line{Code: 200, Flags: "DR", Details: "via_upstream"}, breaker.KindNeither, breaker.ReasonClientCancel, 0},
		{"upstream reset mid-answer", Line{Code: 200, Flags: "UR", Details: "upstream_reset_after_response_started{remote_reset}"}, breaker.KindNeither, breaker.ReasonStreamError, 0},
		{"provider 500, then reset", Line{Code: 500, Flags: "UR", Details: "upstream_reset_after_response_started{remote_reset}"}, breaker.KindStatus, "", 500},
		{"no cluster", Line{Code: 503, Flags: "NC", Details: "cluster_not_found"}, breaker.KindNeither, breaker.ReasonClusterNotFound, 0},
		{"the provider's 503", Line{Code: 503, Flags: "-", Details: "via_upstream"}, breaker.KindStatus, "", 503},
		{"a flag fusebox does not judge", Line{Code: 429, Flags: "RL"}, breaker.KindStatus, "", 429},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := resultOf(&tc.line)
			if r.Kind != tc.kind || r.Reason != tc.reason || r.Status != tc.status {
				t.Fatalf("got %v %q %d, want %v %q %d", r.Kind, r.Reason, r.Status, tc.kind, tc.reason, tc.status)
			}
		})
	}
}

// #52, as live (processor TestRetryNoHostToAnUnreachedClusterIsAConfigError):
// a retry's UH (attempts > 1, no cluster) to a cluster no earlier line
// reached is a missing cluster, a neither that never opens the route;
// after a line that reached the cluster, the same lines open it. Before,
// every UH line was a connection error.
func TestReplayRetryNoHostToAnUnreachedCluster(t *testing.T) {
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lines := func(reachedFirst bool) []byte {
		var b bytes.Buffer
		if reachedFirst {
			fmt.Fprintf(&b, `{"start_time":"1764590399.000","duration_ms":12,"code":200,"flags":"-","details":"via_upstream","cluster":"ca","attempts":1,"gateway":"default","route":"a:r:m","fusebox":{"decision":"d","model":"m","outcome":"success","reason":"success"}}`+"\n")
		}
		for i := range 5 {
			fmt.Fprintf(&b, `{"start_time":"%d.000","duration_ms":3,"code":503,"flags":"UH","details":"no_healthy_upstream","cluster":"-","attempts":"2","gateway":"default","route":"a:r:m","fusebox":{"decision":"u%d","model":"m"}}`+"\n", 1764590400+i, i)
		}
		return b.Bytes()
	}
	for _, tc := range []struct {
		name    string
		reached bool
		opens   bool
	}{{"cluster never reached", false, false}, {"cluster reached before", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			if err := os.WriteFile(path, lines(tc.reached), 0o600); err != nil {
				t.Fatal(err)
			}
			log, err := ReadFiles(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(log.Lines) == 0 || log.Lines[len(log.Lines)-1].Attempts != 2 {
				t.Fatalf("attempts not read: %+v", log.Lines)
			}
			b := Run(rt, log).byKey["default|a:r:m"]
			opened := b != nil && len(b.Transitions) > 0 && b.Transitions[0].Change == "closed->open"
			if opened != tc.opens {
				t.Fatalf("opened %v, want %v: %+v", opened, tc.opens, b)
			}
		})
	}
}
