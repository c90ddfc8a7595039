package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"github.com/fusebox-llm/fusebox/pkg/echo"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// Gateways serves the admin config API (R-API2, R-API2a): read, change and
// revert every gateway's document; changes are overlays on the file, kept by
// the Manager's store and in force at once.
type Gateways struct {
	Manager *routes.Manager
	API     *API
	// Refused counts a body refused by the R-L13 bounds
	// (fusebox_refused_total{what="admin_json_bounds"}); nil = not counted.
	Refused func(what string)
}

// Register adds the config endpoints to s.
func (g *Gateways) Register(s *Server) {
	s.HandleAPI("GET /admin/v1/gateways", g.list)
	s.HandleAPI("GET /admin/v1/gateways/{id}", g.get)
	s.HandleAPI("PUT /admin/v1/gateways/{id}", g.put)
	s.HandleAPI("PATCH /admin/v1/gateways/{id}", g.patch)
	s.HandleAPI("DELETE /admin/v1/gateways/{id}", g.delete)
	s.HandleAPI("DELETE /admin/v1/gateways/{id}/overlay", g.revert)
	// R-API2b: one model or route of a gateway.
	for _, field := range []string{"models", "routes"} {
		s.HandleAPI("GET /admin/v1/gateways/{id}/"+field+"/{name}", g.getEntry(field))
		s.HandleAPI("PUT /admin/v1/gateways/{id}/"+field+"/{name}", g.changeEntry(field, routes.EntryPut))
		s.HandleAPI("PATCH /admin/v1/gateways/{id}/"+field+"/{name}", g.changeEntry(field, routes.EntryPatch))
		s.HandleAPI("DELETE /admin/v1/gateways/{id}/"+field+"/{name}", g.changeEntry(field, routes.EntryDelete))
	}
}

// conditional carries the request's If-Match to the change (R-API2b: a
// stale revision is 412).
func conditional(r *http.Request) context.Context {
	if v := r.Header.Get("If-Match"); v != "" {
		return routes.WithIfMatch(r.Context(), v)
	}
	return r.Context()
}

// writeDoc answers with a gateway's document and its revision as ETag.
func writeDoc(w http.ResponseWriter, code int, gw *routes.Gateway) {
	w.Header().Set("ETag", `"`+routes.Revision(gw.Doc)+`"`)
	WriteJSON(w, code, document(gw))
}

func (g *Gateways) getEntry(field string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, name := r.PathValue("id"), r.PathValue("name")
		e, err := g.Manager.Entry(id, field, name)
		if g.answer(w, err) {
			if gw := g.Manager.Holder.Load().Gateways[id]; gw != nil {
				w.Header().Set("ETag", `"`+routes.Revision(gw.Doc)+`"`)
			}
			WriteJSON(w, http.StatusOK, e)
		}
	}
}

func (g *Gateways) changeEntry(field string, op routes.EntryOp) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, name := r.PathValue("id"), r.PathValue("name")
		var body []byte
		if op != routes.EntryDelete {
			var ok bool
			if body, ok = readBody(w, r); !ok {
				return
			}
		}
		before := g.Manager.Holder.Load().Gateways[id]
		gw, err := g.Manager.ChangeEntry(conditional(r), id, field, name, op, body)
		if g.answer(w, err) {
			g.logChange(r, fmt.Sprintf("%s %s", strings.ToLower(r.Method), strings.TrimSuffix(field, "s")), id, before, gw)
			writeDoc(w, http.StatusOK, gw)
		}
	}
}

// document is a gateway's document with its source and, read-only, the
// gateway-level policy in force once templates and defaults apply (so an
// editor can show what an unset field means). Both are ignored when sent
// back.
func document(gw *routes.Gateway) map[string]any {
	var doc map[string]any
	if err := json.Unmarshal(gw.Doc, &doc); err != nil || doc == nil {
		doc = map[string]any{"id": gw.ID}
	}
	doc["source"] = gw.Source
	doc["effective"] = map[string]any{"circuit_breaker": gw.Policy}
	doc["revision"] = routes.Revision(gw.Doc)
	return doc
}

var reLineSuffix = regexp.MustCompile(` \(line \d+(, [^)]*)?\)`)

// reLongQuoted finds a quoted name over echo.MaxName bytes in a config
// problem (the compiler quotes every name it reports with %q).
var reLongQuoted = regexp.MustCompile(`"(?:[^"\\]|\\.){257,}"`)

// clipQuoted cuts every quoted name in msg to echo.MaxName bytes (R-L2):
// a document naming a 60 KB route must not come back whole.
func clipQuoted(msg string) string {
	return reLongQuoted.ReplaceAllStringFunc(msg, func(q string) string {
		return `"` + echo.Name(q[1:len(q)-1]) + `"`
	})
}

func (g *Gateways) list(w http.ResponseWriter, r *http.Request) {
	rt := g.Manager.Holder.Load()
	out := make([]map[string]any, 0, len(rt.GatewayIDs))
	for _, id := range rt.GatewayIDs {
		out = append(out, document(rt.Gateways[id]))
	}
	WriteJSON(w, http.StatusOK, out)
}

func (g *Gateways) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	gw, ok := g.Manager.Holder.Load().Gateways[id]
	if !ok {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("gateway %q not found", echo.Name(id)))
		return
	}
	writeDoc(w, http.StatusOK, gw)
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			WriteError(w, http.StatusRequestEntityTooLarge, "the body is over 1 MiB")
		} else {
			WriteError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		}
		return nil, false
	}
	return b, true
}

func (g *Gateways) put(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	before, existed := g.Manager.Holder.Load().Gateways[id]
	gw, err := g.Manager.Put(conditional(r), id, body)
	if g.answer(w, err) {
		code := http.StatusOK
		if !existed {
			code = http.StatusCreated
		}
		g.logChange(r, "put", id, before, gw)
		writeDoc(w, code, gw)
	}
}

func (g *Gateways) patch(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	before := g.Manager.Holder.Load().Gateways[id]
	gw, err := g.Manager.Patch(conditional(r), id, body)
	if g.answer(w, err) {
		g.logChange(r, "patch", id, before, gw)
		writeDoc(w, http.StatusOK, gw)
	}
}

func (g *Gateways) delete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	before := g.Manager.Holder.Load().Gateways[id]
	if g.answer(w, g.Manager.Delete(conditional(r), id)) {
		g.logChange(r, "delete", id, before, nil)
		WriteJSON(w, http.StatusOK, map[string]any{"id": id, "deleted": true, "source": routes.SourceAdmin})
	}
}

func (g *Gateways) revert(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	before := g.Manager.Holder.Load().Gateways[id]
	gw, err := g.Manager.RevertOverlay(r.Context(), id)
	if !g.answer(w, err) {
		return
	}
	g.logChange(r, "revert", id, before, gw)
	if gw == nil {
		WriteJSON(w, http.StatusOK, map[string]any{"id": id, "deleted": true, "source": routes.SourceFile})
		return
	}
	WriteJSON(w, http.StatusOK, document(gw))
}

// answer writes the error of a change, if any: 400 naming the field for an
// invalid document, 404 for an unknown gateway, 503 when the change could
// not be stored. It reports whether the change was made.
func (g *Gateways) answer(w http.ResponseWriter, err error) bool {
	var ce *routes.ConfigError
	var be *routes.JSONBoundsError
	switch {
	case err == nil:
		return true
	case errors.As(err, &be):
		if g.Refused != nil {
			g.Refused("admin_json_bounds")
		}
		WriteError(w, http.StatusBadRequest, be.Error())
	case errors.As(err, &ce):
		// Line numbers point into a YAML spelling of the JSON body: they
		// would mean nothing to the sender.
		WriteError(w, http.StatusBadRequest, clipQuoted(reLineSuffix.ReplaceAllString(strings.Join(ce.Problems, "; "), "")))
	case errors.Is(err, routes.ErrNotFound):
		WriteError(w, http.StatusNotFound, "gateway or overlay not found")
	case errors.Is(err, routes.ErrNoEntry):
		WriteError(w, http.StatusNotFound, "the gateway has no such model or route")
	case errors.Is(err, routes.ErrStale):
		WriteError(w, http.StatusPreconditionFailed, err.Error()+": GET the gateway again and apply the change to its current revision")
	default:
		WriteError(w, http.StatusServiceUnavailable, err.Error())
	}
	return false
}

// logChange writes the one [admin] line of a change: who (the client's
// address), what (the action and every field path that changed), never a
// token or a body.
func (g *Gateways) logChange(r *http.Request, action, id string, before, after *routes.Gateway) {
	var a, b any
	if before != nil {
		_ = json.Unmarshal(before.Doc, &a)
	}
	if after != nil {
		_ = json.Unmarshal(after.Doc, &b)
	}
	var changed []string
	diffPaths("", a, b, &changed)
	sort.Strings(changed)
	if len(changed) > 20 {
		changed = append(changed[:20], fmt.Sprintf("… %d more", len(changed)-20))
	}
	g.API.Log.Info("[admin] gateway "+action, "client", r.RemoteAddr, "gateway", id, "fields", strings.Join(changed, ","))
}

// diffPaths lists the paths at which two JSON values differ.
func diffPaths(path string, a, b any, out *[]string) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		keys := map[string]bool{}
		for k := range am {
			keys[k] = true
		}
		for k := range bm {
			keys[k] = true
		}
		for k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			diffPaths(p, am[k], bm[k], out)
		}
		return
	}
	ab, _ := json.Marshal(a)
	bb, _ := json.Marshal(b)
	if string(ab) != string(bb) {
		if path == "" {
			path = "(whole document)"
		}
		*out = append(*out, path)
	}
}
