package admin

import (
	"net/http"
	"strconv"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// The incident view's data (SPEC R-API7): a summary per gateway and model
// (how many routes are healthy, and which degradation is in force), and
// the recent transitions with their evidence and what handled the next
// request.

// ModelSummary is one model's health.
type ModelSummary struct {
	Gateway string `json:"gateway"`
	Model   string `json:"model"`
	Healthy int    `json:"healthy"` // routes a request can take as usual
	Total   int    `json:"total"`
	// Unhealthy lists the routes a prod breaker skips (open, half-open
	// with its probes out, Retry-After-blocked).
	Unhealthy []string `json:"unhealthy"`
	// WouldSkip lists the routes a shadow breaker would skip: they take
	// traffic as usual (R-M2).
	WouldSkip []string `json:"would_skip"`
	// Degradation is what routing does about it: "" (nothing), "try_all"
	// or "fail_fast" (every route unhealthy: when_all_open), "floor" (the
	// capacity floor keeps unhealthy routes in: max_ejection_percent).
	Degradation string `json:"degradation"`
}

// Summary computes every gateway's model summaries at now.
func Summary(rt *routes.Runtime, st breaker.Store, now int64) []ModelSummary {
	out := []ModelSummary{}
	for _, id := range rt.GatewayIDs {
		g := rt.Gateways[id]
		for _, name := range g.ModelNames {
			m := g.Models[name]
			s := ModelSummary{Gateway: id, Model: name, Unhealthy: []string{}, WouldSkip: []string{}}
			for _, r := range m.Candidates(nil) {
				s.Total++
				if r.Policy.Mode == breaker.ModeOff || !r.Policy.Enabled {
					s.Healthy++
					continue
				}
				status := statusOf(st, breaker.RouteID(id, r.Key), r.Policy, now)
				blocked := status.BlockedUntil != nil && *status.BlockedUntil > float64(now)/1e9
				bad := status.State != "closed" || blocked
				switch {
				case !bad:
					s.Healthy++
				case r.Policy.Mode == breaker.ModeShadow:
					s.Healthy++
					s.WouldSkip = append(s.WouldSkip, r.Key)
				default:
					s.Unhealthy = append(s.Unhealthy, r.Key)
				}
			}
			switch ejected := len(s.Unhealthy); {
			case ejected == 0:
			case ejected == s.Total:
				s.Degradation = m.Policy.WhenAllOpen
			case ejected > s.Total*m.Policy.MaxEjectionPercent/100:
				s.Degradation = "floor"
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
	WriteJSON(w, http.StatusOK, a.Journal.Recent(n))
}
