package replay

import (
	"bytes"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// #54 (R-R5): -html shows what the text shows, in its order: the
// difference first when there is a baseline, then the candidate and the
// baseline, each with its client errors avoided and added next to what
// happened, its routes' cost, its transitions, and a legend for the
// timelines. Before, the page had none of the difference, avoided or
// added errors, cost or transitions, and put the baseline first.
func TestHTMLShowsWhatTheTextShows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, synthetic(20, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := ReadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	runOn := func(threshold string) *Report {
		rt, err := routes.Parse([]byte(strings.Replace(cfg, "failure_threshold: 3", "failure_threshold: "+threshold, 1)), routes.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return Run(rt, log)
	}
	res := &Result{Candidate: runOn("3"), Baseline: runOn("5")}
	var text, out bytes.Buffer
	res.WriteText(&text)
	if err := res.WriteHTML(&out, 1764590400, 1764590420); err != nil {
		t.Fatal(err)
	}
	page := out.String()
	d := res.Difference
	want := []string{
		"What the candidate changes",
		fmt.Sprintf("client errors %+d", d.ClientErrors),
		fmt.Sprintf("%d client errors avoided, %d added", res.Candidate.Avoided, res.Candidate.Added),
		fmt.Sprintf("%d client errors avoided, %d added", res.Baseline.Avoided, res.Baseline.Added),
		"class=\"legend\"",
	}
	for _, rr := range res.Candidate.Routes {
		want = append(want, fmt.Sprintf("%.4f (%.4f)", rr.Cost, rr.CostEstimated))
		for _, tr := range rr.Transitions {
			line := fmt.Sprintf("%s %s/%s %s (%s)", rfc3339(tr.At), rr.Gateway, rr.Route, tr.Change, withOrigin(tr))
			if !strings.Contains(text.String(), line) {
				t.Fatalf("the text lacks its own transition line %q", line)
			}
			want = append(want, html.EscapeString(line))
		}
	}
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("the page lacks %q", w)
		}
	}
	diffAt, candAt, baseAt := strings.Index(page, "What the candidate changes"), strings.Index(page, "<h2>candidate</h2>"), strings.Index(page, "<h2>baseline</h2>")
	if diffAt < 0 || candAt < diffAt || baseAt < candAt {
		t.Errorf("the page's order: difference at %d, candidate at %d, baseline at %d", diffAt, candAt, baseAt)
	}
}

// R-FD1, R-FD5: replay's transitions carry their evidence's origin, as
// the live journal does: a count of 503s is upstream, in the text too.
func TestReplayTransitionsCarryTheirOrigin(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, synthetic(20, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := ReadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := Run(rt, log)
	a := rep.byKey["default|a:r:m"]
	if a == nil || len(a.Transitions) == 0 || a.Transitions[0].Origin != "upstream" {
		t.Fatalf("the opening's origin: %+v", a)
	}
	var text bytes.Buffer
	(&Result{Candidate: rep}).WriteText(&text)
	if !strings.Contains(text.String(), "closed->open (provider_5xx, upstream)") {
		t.Fatalf("the text lacks the origin:\n%s", text.String())
	}
}
