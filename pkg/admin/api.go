package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/echo"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// API serves the breaker endpoints of /admin/v1 (R-API1, R-API3, R-API4).
type API struct {
	Config *routes.Holder
	Store  breaker.Store
	Clock  breaker.Clock
	Log    *slog.Logger
	// History feeds the routes' sparklines (may be nil).
	History *breaker.History
	// Baseline reports a route's latency baseline (may be nil).
	Baseline func(breaker.ID, int64) int64
	// Journal is this replica's recent transitions (may be nil).
	Journal *breaker.Journal
	// FleetJournal is the fleet's, in the store (nil: this replica's
	// alone); /admin/v1/transitions merges the two.
	FleetJournal breaker.FleetJournal
}

// Register adds the API's routes to s.
func (a *API) Register(s *Server) {
	s.HandleAPI("GET /admin/v1/gateways/{id}/circuit-breaker", a.gatewayCircuitBreaker)
	s.HandleAPI("GET /admin/v1/gateways/{id}/routes", a.gatewayRoutes)
	s.HandleAPI("GET /admin/v1/gateways/{id}/timeline", a.gatewayTimeline)
	s.HandleAPI("POST /admin/v1/gateways/{id}/routes/{route}/{action}", a.routeOverride)
	s.HandleAPI("GET /admin/v1/summary", a.summary)
	s.HandleAPI("GET /admin/v1/transitions", a.transitions)
	s.HandleAPI("GET /admin/v1/fleets", a.fleets)
	s.HandleAPI("GET /admin/v1/fleets/{name}/circuit-breaker", a.fleetCircuitBreaker)
	s.HandleAPI("POST /admin/v1/fleets/{name}/{action}", a.fleetOverride)
}

func (a *API) now() int64 { return a.Clock.Now().UnixNano() }

func (a *API) gateway(w http.ResponseWriter, r *http.Request) (*routes.Gateway, bool) {
	id := r.PathValue("id")
	g, ok := a.Config.Load().Gateways[id]
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("gateway %q not found", echo.Name(id)))
	}
	return g, ok
}

func (a *API) gatewayCircuitBreaker(w http.ResponseWriter, r *http.Request) {
	if g, ok := a.gateway(w, r); ok {
		WriteJSON(w, http.StatusOK, GatewayCircuitBreaker(g, a.Store, a.now()))
	}
}

func (a *API) gatewayRoutes(w http.ResponseWriter, r *http.Request) {
	if g, ok := a.gateway(w, r); ok {
		WriteJSON(w, http.StatusOK, GatewayRoutes(g, a.Store, a.History, a.Baseline, a.now()))
	}
}

func (a *API) fleets(w http.ResponseWriter, r *http.Request) {
	rt := a.Config.Load()
	out := map[string]breaker.Status{}
	for _, name := range rt.FleetNames {
		out[name] = FleetStatus(rt.Fleets[name], a.Store, a.now())
	}
	WriteJSON(w, http.StatusOK, out)
}

func (a *API) fleet(w http.ResponseWriter, r *http.Request) (*routes.Fleet, bool) {
	name := r.PathValue("name")
	f, ok := a.Config.Load().Fleets[name]
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("fleet %q not found", echo.Name(name)))
	}
	return f, ok
}

func (a *API) fleetCircuitBreaker(w http.ResponseWriter, r *http.Request) {
	if f, ok := a.fleet(w, r); ok {
		WriteJSON(w, http.StatusOK, FleetStatus(f, a.Store, a.now()))
	}
}

func (a *API) routeOverride(w http.ResponseWriter, r *http.Request) {
	g, ok := a.gateway(w, r)
	if !ok {
		return
	}
	key := r.PathValue("route")
	rt, ok := g.Routes[key]
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("route %q not found in gateway %q", echo.Name(key), echo.Name(g.ID)))
		return
	}
	id := breaker.RouteID(g.ID, key)
	if a.override(w, r, id, rt.Policy, "gateway", g.ID, "route", key) {
		WriteJSON(w, http.StatusOK, map[string]breaker.Status{key: statusOf(a.Store, id, rt.Policy, a.now())})
	}
}

func (a *API) fleetOverride(w http.ResponseWriter, r *http.Request) {
	f, ok := a.fleet(w, r)
	if !ok {
		return
	}
	id := breaker.FleetID(f.Name)
	if a.override(w, r, id, f.Policy, "fleet", f.Name) {
		WriteJSON(w, http.StatusOK, map[string]breaker.Status{f.BreakerKey(): statusOf(a.Store, id, f.Policy, a.now())})
	}
}

// override applies force-open / force-close / reset (R-S5, R-API4). It
// answers the error itself and reports whether the change was made.
func (a *API) override(w http.ResponseWriter, r *http.Request, id breaker.ID, p *breaker.Policy, who ...any) bool {
	ctx, k := r.Context(), breaker.KeyOf(id)
	action := r.PathValue("action")
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		WriteError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return false
	}
	now := a.now()
	switch action {
	case "force-open":
		d, err := ParseForceOpen(body)
		if err != nil {
			WriteError(w, http.StatusBadRequest, err.Error())
			return false
		}
		if !p.Active() {
			WriteError(w, http.StatusConflict, "the breaker is off (mode off or enabled: false): force-open would have no effect")
			return false
		}
		err = a.Store.ForceOpen(ctx, k, now, d)
		if err == nil {
			a.Log.Info("[admin] force-open", append(who, "duration_sec", int64(d/time.Second))...)
		}
		return a.storeResult(w, err)
	case "force-close", "reset":
		if len(bytes.TrimSpace(body)) > 0 && !bytes.Equal(bytes.TrimSpace(body), []byte("{}")) {
			WriteError(w, http.StatusBadRequest, action+" takes no body")
			return false
		}
		if action == "reset" {
			err = a.Store.Reset(ctx, k, now)
		} else {
			err = a.Store.ForceClose(ctx, k, now)
		}
		if err == nil {
			a.Log.Info("[admin] "+action, who...)
		}
		return a.storeResult(w, err)
	}
	WriteError(w, http.StatusNotFound, fmt.Sprintf("unknown action %q (force-open, force-close, reset)", echo.Name(action)))
	return false
}

func (a *API) storeResult(w http.ResponseWriter, err error) bool {
	if err != nil {
		WriteError(w, http.StatusServiceUnavailable, "store: "+err.Error())
		return false
	}
	return true
}

// maxForceSec bounds a force-open duration (R-P1: one week).
const maxForceSec = 604800

// ParseForceOpen reads the optional force-open body {"duration_sec": N}.
// An empty body, {} or a null duration mean "until closed by hand".
func ParseForceOpen(body []byte) (time.Duration, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return 0, nil
	}
	if err := routes.CheckJSONBounds(body); err != nil {
		return 0, err
	}
	var v struct {
		DurationSec json.RawMessage `json:"duration_sec"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return 0, fmt.Errorf("body: want {\"duration_sec\": N}: %v", err)
	}
	if dec.More() {
		return 0, errors.New("body: trailing data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, errors.New("body: trailing data after the JSON object")
	}
	if len(v.DurationSec) == 0 || string(v.DurationSec) == "null" {
		return 0, nil
	}
	var f float64
	// A JSON number only: encoding/json would also take "5" into a
	// json.Number.
	c := v.DurationSec[0]
	err := json.Unmarshal(v.DurationSec, &f)
	if err != nil || !(c == '-' || c >= '0' && c <= '9') || f != math.Trunc(f) || f < 1 || f > maxForceSec {
		return 0, fmt.Errorf("duration_sec: must be a whole number of seconds in 1..%d, got %s", maxForceSec, v.DurationSec)
	}
	return time.Duration(f) * time.Second, nil
}
