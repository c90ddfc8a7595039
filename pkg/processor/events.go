package processor

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
)

// EventReporter turns breaker transitions into the `[circuit_breaker]` log
// line and the transition and state metrics (SPEC §9).
type EventReporter struct {
	Log     *slog.Logger
	Metrics *metrics.Metrics
	// Journal, when set, keeps the transition for the dashboard's
	// timeline.
	Journal *breaker.Journal
	// fleet, once SetFleet names it, is told each journal entry too, so
	// that every replica's timeline shows this one's (the Redis store).
	// Each write goes off the path that reported the transition, at most
	// maxFleetWrites at once; beyond that, or when the store cannot take
	// it, the entry stays in this replica's journal only.
	fleet       atomic.Pointer[fleetJournal]
	fleetWrites atomic.Int32
}

type fleetJournal struct{ breaker.FleetJournal }

// SetFleet names the fleet's journal (the store, once it is open: it may
// report transitions before).
func (r *EventReporter) SetFleet(f breaker.FleetJournal) {
	if f != nil {
		r.fleet.Store(&fleetJournal{f})
	}
}

// maxFleetWrites bounds the journal writes in flight (a store that stalls
// holds each for its op timeout).
const maxFleetWrites = 16

// Report handles one transition.
func (r *EventReporter) Report(e breaker.Event) {
	gw := e.ID.Gateway
	if entry := r.Journal.Add(e); entry.ID != "" {
		if f := r.fleet.Load(); f != nil {
			r.toFleet(f, entry)
		}
	}
	r.Metrics.Transitions.WithLabelValues(gw, e.ID.Route, e.Provider, string(e.ID.Scope), e.Transition(), e.Reason).Inc()
	r.Metrics.State.WithLabelValues(gw, e.ID.Route, e.Provider, string(e.ID.Scope)).Set(float64(e.To))
	openUntil := ""
	switch {
	case e.OpenUntil == breaker.Never:
		openUntil = "never"
	case e.OpenUntil != 0:
		openUntil = time.Unix(0, e.OpenUntil).UTC().Format(time.RFC3339Nano)
	}
	r.Log.Info("[circuit_breaker] "+e.Transition(),
		"transition", e.Transition(),
		"reason", e.Reason,
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

// View sets the state gauge of a breaker whose state this replica learned
// from the shared store (another replica made the transition and reports
// it; this one only shows where it stands).
func (r *EventReporter) View(id breaker.ID, st breaker.State) {
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

// toFleet writes entry to the fleet's journal in its own goroutine: a
// transition is reported on the decision and record paths, which never
// wait for the store (R-L11).
func (r *EventReporter) toFleet(f *fleetJournal, entry breaker.JournalEntry) {
	if r.fleetWrites.Add(1) > maxFleetWrites {
		r.fleetWrites.Add(-1)
		return
	}
	raw, err := json.Marshal(entry)
	if err != nil {
		r.fleetWrites.Add(-1)
		return
	}
	go func() {
		defer r.fleetWrites.Add(-1)
		_ = f.AppendJournal(context.Background(), raw) // the store bounds it and counts its failures
	}()
}
