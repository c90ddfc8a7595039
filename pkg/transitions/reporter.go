package transitions

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
)

// Reporter turns breaker transitions into the `[circuit_breaker]` log
// line and the transition and state metrics (SPEC §9).
type Reporter struct {
	Log     *slog.Logger
	Metrics *metrics.Metrics
	// Journal, when set, keeps the transition for the dashboard's
	// timeline.
	Journal *breaker.Journal
	// fleet, once SetFleet names it, is told each journal entry too, so
	// that every replica's timeline shows this one's (the Redis store).
	// The writes go off the path that reported the transition, through
	// one writer at a time that takes every entry queued since its last
	// write in one round trip: a burst of transitions (an outage opening
	// every route of a provider) is one call on one connection, not one
	// each. Beyond maxFleetQueue waiting, or when the store cannot take
	// them, entries stay in this replica's journal only.
	fleet atomic.Pointer[fleetJournal]
	// listener, once Listen names it, hears every event first (the
	// processor's traces: an outcome's span shows the transition it made).
	listener atomic.Pointer[func(breaker.Event)]
	fleetMu  sync.Mutex
	queued   [][]byte
	writing  bool
}

type fleetJournal struct{ breaker.FleetJournal }

// SetFleet names the fleet's journal (the store, once it is open: it may
// report transitions before).
func (r *Reporter) SetFleet(f breaker.FleetJournal) {
	if f != nil {
		r.fleet.Store(&fleetJournal{f})
	}
}

// maxFleetQueue bounds the entries waiting for the writer (a store that
// stalls holds a write for its op timeout).
const maxFleetQueue = 256

// Report handles one transition, or a saturation's start or end.
func (r *Reporter) Report(e breaker.Event) {
	if fn := r.listener.Load(); fn != nil {
		(*fn)(e)
	}
	gw := e.ID.Gateway
	if e.Saturation != "" {
		r.saturation(e)
		return
	}
	if entry := r.Journal.Add(e); entry.ID != "" {
		if f := r.fleet.Load(); f != nil {
			r.toFleet(f, entry)
		}
	}
	if e.ReplicaScoped {
		r.replicaScoped(e)
		return
	}
	r.Metrics.Transitions.WithLabelValues(gw, e.ID.Route, e.Provider, string(e.ID.Scope), e.Transition(), e.Reason).Inc()
	r.Metrics.State.WithLabelValues(gw, e.ID.Route, e.Provider, string(e.ID.Scope)).Set(float64(e.To))
	openUntil := openUntilText(e)
	r.Log.Info("[circuit_breaker] "+e.Transition(),
		"transition", e.Transition(),
		"reason", e.Reason,
		"origin", breaker.TransitionOrigin(e.Reason),
		"failures", fmt.Sprintf("%d/%d", e.Failures, e.Threshold),
		"gateway", gw,
		"route", e.ID.Route,
		"provider", e.Provider,
		"scope", string(e.ID.Scope),
		"policy_version", e.PolicyVersion,
		"open_until", openUntil,
		"window_calls", e.WindowCalls,
		"window_failures", e.WindowFailures,
		"reopens", e.Reopens,
		"generation", e.Generation,
		"ramp_until", rampUntil(e),
		"decided_by", decidedBy(e),
	)
}

// replicaScoped reports a transition of this replica's own open (R-FD3):
// its gauge and one line, with the replica and scope replica. The route's
// state and transition counters are the fleet's, and stay as they are.
func (r *Reporter) replicaScoped(e breaker.Event) {
	open := 0.0
	if e.To != breaker.Closed {
		open = 1
	}
	r.Metrics.ReplicaScopedOpen.WithLabelValues(e.ID.Gateway, e.ID.Route).Set(open)
	r.Log.Info("[circuit_breaker] "+e.Transition(),
		"transition", e.Transition(),
		"reason", e.Reason,
		"origin", breaker.TransitionOrigin(e.Reason),
		"failures", fmt.Sprintf("%d/%d", e.Failures, e.Threshold),
		"gateway", e.ID.Gateway,
		"route", e.ID.Route,
		"provider", e.Provider,
		"scope", string(breaker.ScopeReplica),
		"replica", e.Replica,
		"policy_version", e.PolicyVersion,
		"open_until", openUntilText(e),
		"window_calls", e.WindowCalls,
		"window_failures", e.WindowFailures,
		"reopens", e.Reopens,
		"decided_by", decidedBy(e),
	)
}

// openUntilText is an event's open_until for the log line.
func openUntilText(e breaker.Event) string {
	switch {
	case e.OpenUntil == breaker.Never:
		return "never"
	case e.OpenUntil != 0:
		return time.Unix(0, e.OpenUntil).UTC().Format(time.RFC3339Nano)
	}
	return ""
}

// saturation logs a route's quota headroom crossing its floor, and the end
// of it (R-H4): one line each, from the replica whose store call saw it.
func (r *Reporter) saturation(e breaker.Event) {
	if e.Saturation == breaker.SaturationStarted {
		r.Log.Info("[headroom] route saturated: its provider announced less quota than the headroom floor; requests go to the model's other routes until the reset",
			"gateway", e.ID.Gateway, "route", e.ID.Route, "provider", e.Provider,
			"saturated_until", time.Unix(0, e.SaturatedUntil).UTC().Format(time.RFC3339Nano), "decided_by", decidedBy(e))
		return
	}
	r.Log.Info("[headroom] route no longer saturated", "gateway", e.ID.Gateway, "route", e.ID.Route, "provider", e.Provider,
		"decided_by", decidedBy(e))
}

// View sets the state gauge of a breaker whose state this replica learned
// from the shared store (another replica made the transition and reports
// it; this one only shows where it stands).
func (r *Reporter) View(id breaker.ID, st breaker.State) {
	r.Metrics.State.WithLabelValues(id.Gateway, id.Route, id.Provider(), string(id.Scope)).Set(float64(st))
}

// decidedBy names the state that made a transition (the memory store's
// events carry none).
func decidedBy(e breaker.Event) string {
	if e.DecidedBy == "" {
		return "memory"
	}
	return e.DecidedBy
}

// rampUntil says when a recovery ramp begun by this transition ends
// (R-D8): "" when none.
func rampUntil(e breaker.Event) string {
	if e.RampUntil == 0 {
		return ""
	}
	return time.Unix(0, e.RampUntil).UTC().Format(time.RFC3339Nano)
}

// toFleet queues entry for the fleet's journal and starts the writer if
// none runs: a transition is reported on the decision and record paths,
// which never wait for the store (R-L11).
func (r *Reporter) toFleet(f *fleetJournal, entry breaker.JournalEntry) {
	raw, err := json.Marshal(entry)
	if err != nil {
		return
	}
	r.fleetMu.Lock()
	if len(r.queued) >= maxFleetQueue {
		r.fleetMu.Unlock()
		return
	}
	r.queued = append(r.queued, raw)
	start := !r.writing
	r.writing = true
	r.fleetMu.Unlock()
	if start {
		go r.writeFleet(f)
	}
}

// writeFleet writes what is queued, oldest first, until nothing is, and
// ends: no goroutine waits while there are no transitions.
func (r *Reporter) writeFleet(f *fleetJournal) {
	for {
		r.fleetMu.Lock()
		batch := r.queued
		r.queued = nil
		if len(batch) == 0 {
			r.writing = false
			r.fleetMu.Unlock()
			return
		}
		r.fleetMu.Unlock()
		_ = f.AppendJournal(context.Background(), batch...) // the store bounds it and counts its failures
	}
}

// Listen makes fn hear every event the store reports, before it is logged.
func (r *Reporter) Listen(fn func(breaker.Event)) { r.listener.Store(&fn) }
