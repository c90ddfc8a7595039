package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed dashboard/index.html dashboard/app.js dashboard/style.css
var dashboardFiles embed.FS

// RegisterDashboard serves the dashboard (R-API5) at /dashboard: plain
// HTML, CSS and JS embedded in the binary, no build step. The files need no
// token; the page asks the operator for one and sends it on its API calls.
func (s *Server) RegisterDashboard() {
	sub, _ := fs.Sub(dashboardFiles, "dashboard")
	files := http.StripPrefix("/dashboard/", http.FileServer(http.FS(sub)))
	s.mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		b, _ := dashboardFiles.ReadFile("dashboard/index.html")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		// The page must not be framed by another site (clickjacking the
		// force-open buttons).
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		_, _ = w.Write(b)
	})
	s.mux.Handle("GET /dashboard/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Frame-Options", "DENY")
		files.ServeHTTP(w, r)
	}))
}
