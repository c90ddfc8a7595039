package admin

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// models names the gateway's models, in order.
func modelsOf(doc any) string {
	var out []string
	for _, m := range doc.(map[string]any)["models"].([]any) {
		out = append(out, m.(map[string]any)["name"].(string))
	}
	return strings.Join(out, ",")
}

// R-API2b: a gateway PATCH merges models by name and routes by key: an
// entry the patch does not name is kept, one it names is merged. Before,
// RFC 7396 replaced the array, and a PATCH naming one model dropped the
// others with a 200.
func TestPatchMergesNamedEntries(t *testing.T) {
	e := newCfgEnv(t, "", "")
	// Add a second model first (PUT of the sub-resource), then PATCH the
	// gateway naming only the first one.
	if code, body := e.do("PUT", "/admin/v1/gateways/default/models/cheap", `{"routes": ["azure:eu:gpt"]}`); code != 200 {
		t.Fatalf("put model: %d %v", code, body)
	}
	code, doc := e.do("PATCH", "/admin/v1/gateways/default", `{"models": [{"name": "gpt", "order": "cheapest"}], "routes": [{"key": "azure:eu:gpt", "cost_per_mtok": 2}]}`)
	if code != 200 {
		t.Fatalf("patch: %d %v", code, doc)
	}
	if got := modelsOf(doc); got != "gpt,cheap" {
		t.Fatalf("models after a PATCH naming one: %s", got)
	}
	m := doc.(map[string]any)["models"].([]any)[0].(map[string]any)
	if m["order"] != "cheapest" || len(m["routes"].([]any)) != 2 {
		t.Fatalf("the named model was not merged: %v", m)
	}
	rs := doc.(map[string]any)["routes"].([]any)
	if len(rs) != 2 || rs[1].(map[string]any)["cluster"] != "c2" || rs[1].(map[string]any)["cost_per_mtok"] != 2.0 {
		t.Fatalf("routes after a PATCH naming one: %v", rs)
	}
}

// R-API2b sub-resources: GET, PUT, PATCH and DELETE one model or route;
// removing a route a model still names, or a model's last route, is 400
// naming both; an unknown entry is 404.
func TestEntrySubResources(t *testing.T) {
	e := newCfgEnv(t, "", "")
	cases := []struct {
		method, path, body string
		code               int
		want               string // in the answer
	}{
		{"GET", "/admin/v1/gateways/default/models/gpt", "", 200, `"name":"gpt"`},
		{"GET", "/admin/v1/gateways/default/routes/openai:us:gpt", "", 200, `"cluster":"c1"`},
		{"GET", "/admin/v1/gateways/default/models/nope", "", 404, "no such model or route"},
		{"PATCH", "/admin/v1/gateways/default/routes/openai:us:gpt", `{"cluster": "c9"}`, 200, `"cluster":"c9"`},
		{"PUT", "/admin/v1/gateways/default/routes/self:a:gpt", `{"cluster": "gpu"}`, 200, `"key":"self:a:gpt"`},
		{"PATCH", "/admin/v1/gateways/default/models/gpt", `{"routes": ["openai:us:gpt", "azure:eu:gpt", "self:a:gpt"]}`, 200, `"self:a:gpt"`},
		{"DELETE", "/admin/v1/gateways/default/routes/azure:eu:gpt", "", 400, `model \"gpt\"`},
		{"PATCH", "/admin/v1/gateways/default/models/gpt", `{"routes": []}`, 400, `model \"gpt\"`},
		{"PUT", "/admin/v1/gateways/default/models/gpt", `{"name": "other", "routes": ["azure:eu:gpt"]}`, 400, "cannot change"},
		{"DELETE", "/admin/v1/gateways/default/routes/nope", "", 404, "no such"},
		{"PATCH", "/admin/v1/gateways/default/models/gpt", `{"routes": ["openai:us:gpt", "azure:eu:gpt"]}`, 200, `"name":"gpt"`},
		{"DELETE", "/admin/v1/gateways/default/routes/self:a:gpt", "", 200, `"key":"azure:eu:gpt"`},
	}
	for _, tc := range cases {
		code, body := e.do(tc.method, tc.path, tc.body)
		s := jsonString(body)
		if code != tc.code || !strings.Contains(s, tc.want) {
			t.Fatalf("%s %s: %d %s, want %d with %s", tc.method, tc.path, code, s, tc.code, tc.want)
		}
		if tc.code == 400 && strings.Contains(tc.want, "model") && !strings.Contains(s, "azure:eu:gpt") && tc.method == "DELETE" {
			t.Fatalf("%s %s: the refusal names the model but not the route: %s", tc.method, tc.path, s)
		}
	}
}

// R-API2b revisions: every document has one; a change sent with a stale
// If-Match is 412 and changes nothing; the current one goes through.
func TestIfMatchRevision(t *testing.T) {
	e := newCfgEnv(t, "", "")
	_, doc := e.do("GET", "/admin/v1/gateways/default", "")
	rev, _ := doc.(map[string]any)["revision"].(string)
	if len(rev) != 16 {
		t.Fatalf("revision %q", rev)
	}
	if code, body := e.do("PATCH", "/admin/v1/gateways/default", `{"circuit_breaker": {"failure_threshold": 7}}`, "If-Match", `"`+rev+`"`); code != 200 {
		t.Fatalf("a current If-Match: %d %v", code, body)
	}
	for _, req := range []struct{ method, path, body string }{
		{"PATCH", "/admin/v1/gateways/default", `{"circuit_breaker": {"failure_threshold": 9}}`},
		{"PUT", "/admin/v1/gateways/default/models/gpt", `{"routes": ["azure:eu:gpt"]}`},
		{"DELETE", "/admin/v1/gateways/default", ""},
	} {
		if code, body := e.do(req.method, req.path, req.body, "If-Match", rev); code != 412 {
			t.Fatalf("%s %s with a stale If-Match: %d %v", req.method, req.path, code, body)
		}
	}
	_, doc = e.do("GET", "/admin/v1/gateways/default", "")
	if th := doc.(map[string]any)["circuit_breaker"].(map[string]any)["failure_threshold"]; th != 7.0 {
		t.Fatalf("a stale change went through: threshold %v", th)
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// #37: a PATCH's named arrays hold objects with distinct names, and names
// an HTTP path can address: a null entry (stored before, and kept across a
// restart), one name twice (the last silently won), and a model named ".."
// (its DELETE was redirected to the gateway's) are each a 400 naming the
// entry, and nothing is stored.
func TestPatchRefusesWhatItCannotMean(t *testing.T) {
	e := newCfgEnv(t, "", "")
	_, before := e.do("GET", "/admin/v1/gateways/default", "")
	for _, c := range []struct{ body, want string }{
		{`{"models": [null]}`, "models[0]: must be an object"},
		{`{"routes": [{"key": "openai:us:gpt", "cost_per_mtok": 1}, {"key": "openai:us:gpt", "cost_per_mtok": 2}]}`, `routes[1]: key "openai:us:gpt": given twice`},
		{`{"models": [{"name": "..", "routes": ["openai:us:gpt"]}]}`, `".." is not a name`},
		{`{"models": [{"name": "a/b", "routes": ["openai:us:gpt"]}]}`, `must not contain '/'`},
	} {
		code, body := e.do("PATCH", "/admin/v1/gateways/default", c.body)
		msg := fmt.Sprint(body)
		if code != 400 || !strings.Contains(msg, c.want) {
			t.Errorf("PATCH %s: %d %s, want 400 naming %q", c.body, code, msg, c.want)
		}
	}
	if _, after := e.do("GET", "/admin/v1/gateways/default", ""); modelsOf(after) != modelsOf(before) {
		t.Fatalf("a refused PATCH changed the models: %s -> %s", modelsOf(before), modelsOf(after))
	}
}
