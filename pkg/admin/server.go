package admin

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is the admin HTTP handler tree.
type Server struct {
	mux    *http.ServeMux
	api    *http.ServeMux
	health *Health
	auth   Auth
}

// NewServer builds the handler tree. API routes are added with HandleAPI.
func NewServer(health *Health, gatherer prometheus.Gatherer, auth Auth) *Server {
	s := &Server{mux: http.NewServeMux(), api: http.NewServeMux(), health: health, auth: auth}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rep := health.Report()
		code := http.StatusOK
		if !rep.Ready {
			code = http.StatusServiceUnavailable
		}
		WriteJSON(w, code, rep)
	})
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	s.mux.Handle("/admin/v1/", auth.Wrap(s.api))
	s.api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, "no such admin endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s
}

// HandleAPI registers an /admin/v1 handler (pattern as for http.ServeMux,
// e.g. "GET /admin/v1/gateways/{id}/circuit-breaker").
func (s *Server) HandleAPI(pattern string, h http.HandlerFunc) { s.api.HandleFunc(pattern, h) }

// Handle registers an unauthenticated handler (dashboard static files).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }
