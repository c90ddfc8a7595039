package admin

import (
	"context"
	"net/http"
	"strconv"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/plan"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// The incident view's data (SPEC R-API7): a summary per gateway and model
// (how many routes are healthy, and which degradation is in force), and
// the recent transitions with their evidence and what handled the next
// request.

// ModelSummary is one model's health, as routing sees it now.
type ModelSummary struct {
	Gateway string `json:"gateway"`
	Model   string `json:"model"`
	Healthy int    `json:"healthy"` // routes a request can take as usual
	Total   int    `json:"total"`
	// Unhealthy lists the routes a prod breaker (the route's, or its
	// fleet's) says are unhealthy: open, half-open with its probes out,
	// Retry-After-blocked, forced open.
	Unhealthy []string `json:"unhealthy"`
	// Skipped lists the routes a request passes over now: routing's own
	// choice (plan.Select), after the floor and when_all_open.
	Skipped []string `json:"skipped"`
	// WouldSkip lists the routes a shadow breaker would skip: they take
	// traffic as usual (R-M2).
	WouldSkip []string `json:"would_skip"`
	// Saturated lists the routes passed over because their provider
	// announced less quota than the headroom floor (R-H2): healthy, and
	// counted in Healthy, but not taking requests now.
	Saturated []string `json:"saturated"`
	// Degradation is what routing does about it: "" (nothing is
	// unhealthy), "skipping" (unhealthy routes are passed over),
	// "floor" (the capacity floor keeps some unhealthy routes in:
	// max_ejection_percent), "saturated" (healthy routes whose quota is
	// nearly gone are passed over), "try_all" or "fail_fast" (nothing is
	// healthy: when_all_open), "fail_fast_forced" (a try_all model whose
	// routes are all unhealthy and some forced open: forced routes are
	// left out of try_all, so it fails fast).
	Degradation string `json:"degradation"`
	// Forced lists the routes forced open (an operator's force-open).
	// Forced routes are left out of try_all (R-F3): a model configured
	// when_all_open: try_all whose every route is forced fails fast, and
	// degradation says "fail_fast_forced" (before, plain fail_fast, on a
	// gateway configured try_all, with nothing saying why).
	Forced []string `json:"forced"`
	// ReplicaScoped lists the unhealthy routes this replica alone holds
	// open (R-FD3): its Envoy got no answer from them, and too few
	// replicas saw the same for the fleet to open them.
	ReplicaScoped []string `json:"replica_scoped"`
}

// DegradationFailFastForced: a try_all model fails fast because its
// healthy-looking remainder is forced open, and forced routes are left out
// of try_all (R-F3).
const DegradationFailFastForced = "fail_fast_forced"

// Summary computes every gateway's model summaries at now, from the same
// verdicts and the same selection a decision makes (each route's and its
// fleet's breaker, breaker.Target; plan.Select). Before, it read the
// routes' own breakers only, through Status: a fleet's open showed 2 of 2
// healthy, a model skipping a route read "routing as usual", and every
// route forced open read try_all while routing failed fast.
func Summary(rt *routes.Runtime, st breaker.Store, now int64) []ModelSummary {
	out := []ModelSummary{}
	ctx := context.Background()
	for _, id := range rt.GatewayIDs {
		g := rt.Gateways[id]
		for _, name := range g.ModelNames {
			m := g.Models[name]
			s := ModelSummary{Gateway: id, Model: name, Unhealthy: []string{}, Skipped: []string{}, WouldSkip: []string{}, Saturated: []string{}, Forced: []string{}, ReplicaScoped: []string{}}
			cands := m.Candidates(nil)
			v := make([]breaker.Verdict, len(cands))
			for i, r := range cands {
				t := breaker.Target{Route: breaker.KeyOf(breaker.RouteID(id, r.Key))}
				if r.Fleet != nil {
					t.Fleet, t.HasFleet = breaker.KeyOf(breaker.FleetID(r.Fleet.Name)), true
				}
				tv := t.Peek(ctx, st, now)
				v[i] = tv.Verdict
				s.Total++
				switch {
				case !tv.Allowed:
					s.Unhealthy = append(s.Unhealthy, r.Key)
					if tv.Forced {
						s.Forced = append(s.Forced, r.Key)
					}
					if tv.ReplicaScoped {
						s.ReplicaScoped = append(s.ReplicaScoped, r.Key)
					}
				default:
					s.Healthy++
					if tv.WouldSkip {
						s.WouldSkip = append(s.WouldSkip, r.Key)
					}
				}
			}
			sel := plan.Select(now, v, m.Policy.MaxEjectionPercent, m.Policy.WhenAllOpen, nil, nil)
			for _, i := range sel.Skipped {
				s.Skipped = append(s.Skipped, cands[i].Key)
			}
			for _, i := range sel.Saturated {
				s.Saturated = append(s.Saturated, cands[i].Key)
			}
			switch {
			case sel.FailFast && m.Policy.WhenAllOpen == breaker.WhenAllOpenTryAll && len(s.Forced) > 0:
				s.Degradation = DegradationFailFastForced
			case sel.FailFast:
				s.Degradation = breaker.WhenAllOpenFailFast
			case sel.TryAll:
				s.Degradation = breaker.WhenAllOpenTryAll
			case len(s.Unhealthy) > len(s.Skipped):
				s.Degradation = "floor"
			case len(s.Skipped) > 0:
				s.Degradation = "skipping"
			case len(s.Saturated) > 0:
				s.Degradation = "saturated"
			}
			out = append(out, s)
		}
	}
	return out
}

func (a *API) summary(w http.ResponseWriter, r *http.Request) {
	WriteJSON(w, http.StatusOK, Summary(a.Config.Load(), a.Store, a.now()))
}

// maxTransitions bounds GET /admin/v1/transitions.
const maxTransitions = 256

func (a *API) transitions(w http.ResponseWriter, r *http.Request) {
	n := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l < 1 || l > maxTransitions {
			WriteError(w, http.StatusBadRequest, "limit: must be a whole number in 1..256")
			return
		}
		n = l
	}
	local := a.Journal.Recent(n)
	if a.FleetJournal == nil {
		WriteJSON(w, http.StatusOK, local)
		return
	}
	// The fleet's journal, merged with this replica's (which knows what
	// handled the next request of its own transitions). When the store
	// cannot answer, this replica's alone, and the header says so.
	fleet, err := a.FleetJournal.RecentJournal(r.Context(), n)
	if err != nil {
		w.Header().Set("X-Fusebox-Journal", "replica")
		WriteJSON(w, http.StatusOK, local)
		return
	}
	w.Header().Set("X-Fusebox-Journal", "fleet")
	WriteJSON(w, http.StatusOK, breaker.MergeJournals(local, fleet, n))
}
