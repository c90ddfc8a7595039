package replay

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// TestBaselineDifference (#37, R-R5, R-R7): with -baseline the report
// answers "what would change": the candidate less the baseline, with signs,
// first in the text and as "difference" in the JSON; the JSON is one
// snake_case schema with RFC 3339 times. Before, -baseline printed two
// reports side by side, the JSON mixed Lines/Malformed with
// live_client_errors, and times were raw epoch seconds.
func TestBaselineDifference(t *testing.T) {
	log := &Log{}
	if err := log.read("test", bytes.NewReader(synthetic(40, 10))); err != nil {
		t.Fatal(err)
	}
	run := func(threshold string) *Report {
		rt, err := routes.Parse([]byte(strings.Replace(cfg, "failure_threshold: 3", "failure_threshold: "+threshold, 1)), routes.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return Run(rt, log)
	}
	cand, base := run("3"), run("10")
	res := &Result{Candidate: cand, Baseline: base}
	var text bytes.Buffer
	res.WriteText(&text)
	d := res.Difference
	if d == nil || d.ClientErrors != cand.ClientErrors-base.ClientErrors || d.ClientErrors >= 0 {
		t.Fatalf("difference %+v (candidate %d, baseline %d client errors)", d, cand.ClientErrors, base.ClientErrors)
	}
	first := strings.SplitN(text.String(), "\n", 2)[0]
	if want := "candidate - baseline: client errors -"; !strings.HasPrefix(first, want) {
		t.Fatalf("the text starts %q, want %q", first, want)
	}
	var a RouteDifference
	for _, rd := range d.Routes {
		if rd.Route == "a:r:m" {
			a = rd
		}
	}
	if a.Served >= 0 || a.MetFailing >= 0 {
		t.Fatalf("route a: %+v (the candidate opens sooner: fewer served, fewer met failing)", a)
	}

	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	c := doc["candidate"].(map[string]any)
	for _, k := range []string{"lines", "malformed", "skipped", "client_errors", "client_errors_estimated", "live_client_errors", "live_cost", "avoided", "added", "routes"} {
		if _, ok := c[k]; !ok {
			t.Errorf("candidate has no %q: %v", k, keys(c))
		}
	}
	for k := range c {
		if strings.ToLower(k) != k {
			t.Errorf("candidate field %q is not snake_case", k)
		}
	}
	if _, ok := doc["difference"].(map[string]any)["client_errors"]; !ok {
		t.Fatalf("no difference in the JSON: %v", keys(doc))
	}
	route := c["routes"].([]any)[0].(map[string]any)
	tr := route["transitions"].([]any)[0].(map[string]any)
	if _, err := time.Parse(time.RFC3339, tr["at"].(string)); err != nil {
		t.Fatalf("transition time %v: %v", tr["at"], err)
	}
	band := route["bands"].([]any)[0].(map[string]any)
	if _, err := time.Parse(time.RFC3339, band["from"].(string)); err != nil || band["state"] == nil {
		t.Fatalf("band %v: %v", band, err)
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
