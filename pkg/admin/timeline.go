package admin

import (
	"net/http"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// The incident view's chart (R-API7): per route of a gateway, the last 15
// minutes in 10-second periods (requests by class, this replica's), and
// the breaker's state over the same time as bands, read back from the
// transitions (the fleet's on Redis) and the state now.

// Timeline is GET /admin/v1/gateways/{id}/timeline.
type Timeline struct {
	Now       float64         `json:"now"`  // unix seconds, the server's clock
	From      float64         `json:"from"` // the chart's start
	BucketSec int             `json:"bucket_sec"`
	Source    string          `json:"source"` // "fleet" or "replica": whose transitions the bands come from
	Routes    []RouteTimeline `json:"routes"`
}

// RouteTimeline is one route's chart.
type RouteTimeline struct {
	Route  string                 `json:"route"`
	State  string                 `json:"state"`
	Points []breaker.HistoryPoint `json:"points"`
	Bands  []StateBand            `json:"bands"`
}

// StateBand is a stretch of time in one state.
type StateBand struct {
	From  float64 `json:"from"`
	To    float64 `json:"to"`
	State string  `json:"state"`
}

func (a *API) gatewayTimeline(w http.ResponseWriter, r *http.Request) {
	g, ok := a.gateway(w, r)
	if !ok {
		return
	}
	now := a.now()
	entries := a.Journal.Recent(breaker.FleetJournalLen)
	source := "replica"
	if a.FleetJournal != nil {
		if fleet, err := a.FleetJournal.RecentJournal(r.Context(), breaker.FleetJournalLen); err == nil {
			entries, source = breaker.MergeJournals(entries, fleet, 2*breaker.FleetJournalLen), "fleet"
		}
	}
	WriteJSON(w, http.StatusOK, BuildTimeline(g, a.Store, a.History, entries, now, source))
}

// BuildTimeline is the chart of gateway g at now (unix ns) from the
// transitions in entries (newest first).
func BuildTimeline(g *routes.Gateway, st breaker.Store, h *breaker.History, entries []breaker.JournalEntry, now int64, source string) Timeline {
	end := float64(now) / 1e9
	tl := Timeline{Now: end, From: end - breaker.HistoryBuckets*breaker.HistoryBucketSec, BucketSec: breaker.HistoryBucketSec, Source: source}
	for _, row := range GatewayRoutes(g, st, nil, nil, now) {
		id := breaker.RouteID(g.ID, row.Route)
		var mine []breaker.JournalEntry
		for _, e := range entries {
			if e.Gateway == g.ID && e.Route == row.Route && e.Scope == breaker.ScopeGateway {
				mine = append(mine, e)
			}
		}
		tl.Routes = append(tl.Routes, RouteTimeline{Route: row.Route, State: row.State,
			Points: h.Points(id, now, breaker.HistoryBuckets), Bands: bands(row.State, mine, tl.From, end)})
	}
	return tl
}

// bands walks back from the state now through the transitions (newest
// first): after each, its "to" state; before it, its "from". A transition
// older than the chart ends the walk. Transitions at the same instant (a
// probe admitted and answered within one clock tick) may come in either
// order: of those, the one that ends in the state being walked from is
// taken first, so the chain holds.
func bands(state string, entries []breaker.JournalEntry, from, to float64) []StateBand {
	var out []StateBand
	cur := state
	rest := append([]breaker.JournalEntry(nil), entries...)
	for len(rest) > 0 {
		i := pickNewest(rest, cur)
		e := rest[i]
		rest = append(rest[:i], rest[i+1:]...)
		if e.At > to { // after now (another replica's clock)
			continue
		}
		if e.At <= from {
			break
		}
		out = append(out, StateBand{From: e.At, To: to, State: cur})
		to = e.At
		if before, _, ok := strings.Cut(e.Transition, "->"); ok {
			cur = before
		}
	}
	out = append(out, StateBand{From: from, To: to, State: cur})
	// Oldest first, and no empty stretch.
	var kept []StateBand
	for i := len(out) - 1; i >= 0; i-- {
		if out[i].To > out[i].From {
			kept = append(kept, out[i])
		}
	}
	return kept
}

// pickNewest is the index of the newest entry, of equal ones the first
// that ends in state cur.
func pickNewest(entries []breaker.JournalEntry, cur string) int {
	best := 0
	for i, e := range entries {
		switch {
		case e.At > entries[best].At:
			best = i
		case e.At == entries[best].At && !endsIn(entries[best], cur) && endsIn(e, cur):
			best = i
		}
	}
	return best
}

func endsIn(e breaker.JournalEntry, state string) bool {
	_, to, _ := strings.Cut(e.Transition, "->")
	return to == state
}
