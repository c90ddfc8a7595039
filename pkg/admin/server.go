package admin

import (
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/echo"
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
	if auth.throttle == nil {
		auth.throttle = newLogThrottle()
	}
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
	// Profiles, behind the same guards and token as the API: they reveal
	// the process's memory and can cost CPU.
	prof := http.NewServeMux()
	prof.HandleFunc("/debug/pprof/", pprof.Index)
	prof.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	prof.HandleFunc("/debug/pprof/profile", pprof.Profile)
	prof.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	prof.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.mux.Handle("/debug/pprof/", auth.Wrap(prof))
	s.api.HandleFunc("/", s.unmatched)
	return s
}

// unmatched answers what no endpoint took: 405 with Allow when the path
// exists under other methods, 404 otherwise, both as JSON errors.
func (s *Server) unmatched(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.api.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		WriteError(w, http.StatusMethodNotAllowed, "method "+echo.Name(r.Method)+" is not allowed on "+echo.Name(r.URL.Path)+"; use "+strings.Join(allow, " or "))
		return
	}
	WriteError(w, http.StatusNotFound, "no such admin endpoint: "+echo.Name(r.Method)+" "+echo.Name(r.URL.Path))
}

// HandleAPI registers an /admin/v1 handler (pattern as for http.ServeMux,
// e.g. "GET /admin/v1/gateways/{id}/circuit-breaker").
func (s *Server) HandleAPI(pattern string, h http.HandlerFunc) { s.api.HandleFunc(pattern, h) }

// Handle registers an unauthenticated handler (dashboard static files).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }
