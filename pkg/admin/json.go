package admin

import (
	"encoding/json"
	"net/http"

	"github.com/fusebox-llm/fusebox/pkg/echo"
)

// WriteJSON writes v as a JSON response.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// WriteError writes the admin API's error shape, {"error": "..."}. The
// message is cut so that the body stays within echo.MaxErrorBody whatever
// names it quotes (R-L2).
func WriteError(w http.ResponseWriter, status int, msg string) {
	for {
		b, _ := json.Marshal(map[string]string{"error": msg})
		if len(b) < echo.MaxErrorBody || msg == "" {
			break
		}
		msg = echo.Clip(msg, len(msg)/2)
	}
	WriteJSON(w, status, map[string]string{"error": msg})
}
