package transitions

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// slowFleet is a fleet journal whose writes block until released, and
// which counts the writes at once.
type slowFleet struct {
	mu       sync.Mutex
	inFlight int
	most     int
	calls    int
	got      [][]byte
	release  chan struct{}
}

func (f *slowFleet) AppendJournal(_ context.Context, entries ...[]byte) error {
	f.mu.Lock()
	f.inFlight++
	f.calls++
	f.most = max(f.most, f.inFlight)
	f.mu.Unlock()
	<-f.release
	f.mu.Lock()
	f.inFlight--
	f.got = append(f.got, entries...)
	f.mu.Unlock()
	return nil
}

func (f *slowFleet) RecentJournal(context.Context, int) ([][]byte, error) { return nil, nil }

// A burst of transitions while the store is slow is written by one
// writer, in order, in a few round trips: before, each went in a goroutine
// of its own, 16 at once, each holding a pooled Redis connection (a
// replica's pool grew to its largest burst and stayed).
func TestFleetJournalHasOneWriter(t *testing.T) {
	f := &slowFleet{release: make(chan struct{})}
	r := &Reporter{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics.New(), Journal: breaker.NewJournal(64)}
	r.SetFleet(f)
	const n = 40
	for i := 0; i < n; i++ {
		r.Report(breaker.Event{ID: breaker.ID{Gateway: "gw", Route: "p:r:m" + string(rune('a'+i%26))}, Provider: "p",
			From: breaker.Closed, To: breaker.Open, Reason: "failures", At: int64(i+1) * int64(time.Second)})
	}
	close(f.release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		got, most, calls := len(f.got), f.most, f.calls
		f.mu.Unlock()
		if got == n {
			if most != 1 {
				t.Fatalf("%d journal writes at once, want 1", most)
			}
			if calls > 2 {
				t.Fatalf("%d writes for one burst, want at most 2 (the first entry, then the rest)", calls)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d entries written (%d writes, %d at once)", got, n, calls, most)
		}
		time.Sleep(time.Millisecond)
	}
	var prev float64
	for i, raw := range f.got {
		var e breaker.JournalEntry
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		if e.At <= prev {
			t.Fatalf("entry %d at %v after %v: written out of order", i, e.At, prev)
		}
		prev = e.At
	}
}

// R-H4: a saturation's start and end are one log line each, never a
// transition (no transition metric, no journal entry).
func TestSaturationIsLogged(t *testing.T) {
	var buf strings.Builder
	r := &Reporter{Log: slog.New(slog.NewTextHandler(&buf, nil)), Metrics: metrics.New(), Journal: breaker.NewJournal(8)}
	id := breaker.RouteID("gw", "openai:us:m")
	until := time.Date(2026, 12, 1, 12, 0, 30, 0, time.UTC)
	r.Report(breaker.Event{ID: id, Provider: "openai", Saturation: breaker.SaturationStarted, SaturatedUntil: until.UnixNano(), DecidedBy: breaker.DecidedByRedis})
	r.Report(breaker.Event{ID: id, Provider: "openai", Saturation: breaker.SaturationEnded})
	out := buf.String()
	for _, want := range []string{`msg="[headroom] route saturated`, "saturated_until=2026-12-01T12:00:30Z", "decided_by=redis", `msg="[headroom] route no longer saturated"`, "route=openai:us:m"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[circuit_breaker]") || len(r.Journal.Recent(10)) != 0 {
		t.Fatalf("a judge.Saturation was reported as a transition:\n%s", out)
	}
}

// R-FD1: a transition's log line and journal entry say whether its
// evidence was local (Envoy got no answer) or upstream (the provider
// answered). Before, neither said.
func TestTransitionsCarryTheirOrigin(t *testing.T) {
	var buf strings.Builder
	r := &Reporter{Log: slog.New(slog.NewTextHandler(&buf, nil)), Metrics: metrics.New(), Journal: breaker.NewJournal(8)}
	for _, tc := range []struct{ route, reason, origin string }{
		{"openai:us:m", breaker.ReasonConnection, "local"},
		{"azure:eu:m", breaker.ReasonProvider5xx, "upstream"},
	} {
		r.Report(breaker.Event{ID: breaker.RouteID("gw", tc.route), Provider: "p", From: breaker.Closed, To: breaker.Open, Reason: tc.reason})
		if !strings.Contains(buf.String(), "reason="+tc.reason+" origin="+tc.origin) {
			t.Fatalf("the log line lacks origin=%s:\n%s", tc.origin, buf.String())
		}
	}
	recent := r.Journal.Recent(10)
	origins := map[string]string{}
	for _, e := range recent {
		origins[e.Route] = e.Origin
	}
	if origins["openai:us:m"] != "local" || origins["azure:eu:m"] != "upstream" {
		t.Fatalf("journal origins %v", origins)
	}
}

// TestReplicaScopedTransition (R-FD3): one replica's own open is its
// gauge, a [circuit_breaker] line with scope=replica and the replica, and
// a journal entry with scope replica; the route's state and transition
// counters (the fleet's) do not move.
func TestReplicaScopedTransition(t *testing.T) {
	var logs strings.Builder
	m := metrics.New()
	j := breaker.NewJournal(8)
	r := &Reporter{Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: m, Journal: j}
	id := breaker.ID{Gateway: "gw", Route: "openai:us:m", Scope: breaker.ScopeGateway}
	r.Report(breaker.Event{ID: id, Provider: "openai", From: breaker.Closed, To: breaker.Open, Reason: breaker.ReasonConnection,
		At: int64(time.Second), Failures: 3, Threshold: 3, ReplicaScoped: true, Replica: "pod-a", DecidedBy: breaker.DecidedByLocal})
	if got := testutil.ToFloat64(m.ReplicaScopedOpen.WithLabelValues("gw", "openai:us:m")); got != 1 {
		t.Fatalf("fusebox_replica_scoped_open = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(m.Transitions); n != 0 {
		t.Fatalf("the route's transition counter moved: %d series", n)
	}
	if n := testutil.CollectAndCount(m.State); n != 0 {
		t.Fatalf("the route's state gauge moved: %d series", n)
	}
	line := logs.String()
	for _, want := range []string{"[circuit_breaker] closed->open", "scope=replica", "replica=pod-a", "origin=local", "failures=3/3"} {
		if !strings.Contains(line, want) {
			t.Fatalf("log line %q lacks %q", line, want)
		}
	}
	if es := j.Recent(8); len(es) != 1 || es[0].Scope != breaker.ScopeReplica {
		t.Fatalf("journal %+v, want one entry with scope replica", es)
	}
	r.Report(breaker.Event{ID: id, Provider: "openai", From: breaker.HalfOpen, To: breaker.Closed, Reason: breaker.ReasonProbeSuccess,
		At: int64(2 * time.Second), ReplicaScoped: true, Replica: "pod-a"})
	if got := testutil.ToFloat64(m.ReplicaScopedOpen.WithLabelValues("gw", "openai:us:m")); got != 0 {
		t.Fatalf("fusebox_replica_scoped_open after the close = %v, want 0", got)
	}
}
