package replay

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strings"
	"text/tabwriter"
)

// Result is a replay's output: the candidate's report and, with
// -baseline, the baseline's, of the same lines.
type Result struct {
	Candidate *Report `json:"candidate"`
	Baseline  *Report `json:"baseline,omitempty"`
	// Difference is the candidate less the baseline, with one.
	Difference *Difference `json:"difference,omitempty"`
}

// diff fills Difference when there is a baseline.
func (r *Result) diff() {
	if r.Baseline != nil && r.Difference == nil {
		r.Difference = Diff(r.Candidate, r.Baseline)
	}
}

// WriteText writes the per-route table: candidate, then baseline when
// there is one.
func (r *Result) WriteText(w io.Writer) {
	r.diff()
	if r.Difference != nil {
		// The answer to "what would change" first (R-R5).
		writeDiff(w, r.Difference)
	}
	for _, part := range []struct {
		name string
		rep  *Report
	}{{"candidate", r.Candidate}, {"baseline", r.Baseline}} {
		if part.rep == nil {
			continue
		}
		rep := part.rep
		fmt.Fprintf(w, "%s: %d lines (%d malformed, skipped; %d for a gateway or model it lacks), %d client errors (%d of them estimated)\n",
			part.name, rep.Lines, rep.Malformed, rep.Skipped, rep.ClientErrors, rep.ClientErrorsEstimated)
		for _, ex := range rep.MalformedExamples {
			fmt.Fprintf(w, "  malformed: %s\n", ex)
		}
		fmt.Fprintf(w, "  next to what happened (%d client errors, cost %.4f): %d client errors avoided, %d added\n",
			rep.LiveClientErrors, rep.LiveCost, rep.Avoided, rep.Added)
		if rep.HeadroomMoved > 0 {
			fmt.Fprintf(w, "  headroom: %d requests moved off a route whose quota was nearly gone, %d of them 429s avoided\n",
				rep.HeadroomMoved, rep.HeadroomAvoided429s)
		}
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  gateway\tmodel\troute\topens\topen s\tserved\trouted elsewhere\tmet a failing route (estimated)\tcost (estimated)")
		for _, rr := range rep.Routes {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%.0f\t%d\t%d\t%d (%d)\t%.4f (%.4f)\n", rr.Gateway, rr.Model, rr.Route, rr.Opens, rr.OpenSec, rr.Served, rr.Rerouted, rr.MetFailing, rr.MetFailingEstimated, rr.Cost, rr.CostEstimated)
		}
		tw.Flush()
		for _, rr := range rep.Routes {
			for _, t := range rr.Transitions {
				fmt.Fprintf(w, "  %s %s/%s %s (%s)\n", rfc3339(t.At), rr.Gateway, rr.Route, t.Change, t.Reason)
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, `"estimated": a request the config sent to a route that did not serve it live has no recorded outcome there;`)
	fmt.Fprintln(w, `it is given that route's latest logged outcome before it (else a success), and the tokens it used where it did go.`)
}

// WriteJSON writes the result as one JSON document.
func (r *Result) WriteJSON(w io.Writer) error {
	r.diff()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

var page = template.Must(template.New("replay").Funcs(template.FuncMap{
	"to": func(change string) string {
		_, to, _ := strings.Cut(change, "->")
		return to
	},
	"width": func(a, b, from, to float64) float64 {
		if to <= from {
			return 0
		}
		return 100 * (b - a) / (to - from)
	},
	"time": rfc3339,
	"mid":  func(a, b float64) float64 { return (a + b) / 2 },
	"pct": func(t, from, to float64) float64 {
		if to <= from {
			return 0
		}
		return 100 * (t - from) / (to - from)
	},
}).Parse(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>fusebox replay</title>
<style>body{font:14px system-ui,sans-serif;margin:1.5rem}table{border-collapse:collapse}td,th{padding:.2rem .6rem;border-bottom:1px solid #ddd;text-align:left}
.band{position:relative;height:14px;background:#e8f5e9;width:900px;margin:.2rem 0 1rem}.mark{position:absolute;top:0;width:2px;height:14px}
.span{position:absolute;top:0;height:14px;opacity:.35}.fail{position:absolute;top:9px;width:1px;height:5px;background:#b00020}
.axis{position:relative;width:900px;height:1.2rem;font-size:12px;color:#555}.axis span{position:absolute}.open{background:#b00020}.half_open{background:#b35900}.closed{background:#1a7f37}</style></head><body>
<h1>fusebox replay</h1>
{{range $name, $rep := .Parts}}{{if $rep}}<h2>{{$name}}</h2>
<p>{{$rep.Lines}} lines, {{$rep.Malformed}} malformed, {{$rep.ClientErrors}} client errors ({{$rep.ClientErrorsEstimated}} estimated).</p>
<table><tr><th>gateway</th><th>model</th><th>route</th><th>opens</th><th>open s</th><th>served</th><th>routed elsewhere</th><th>met failing (estimated)</th></tr>
{{range $rep.Routes}}<tr><td>{{.Gateway}}</td><td>{{.Model}}</td><td>{{.Route}}</td><td>{{.Opens}}</td><td>{{printf "%.0f" .OpenSec}}</td><td>{{.Served}}</td><td>{{.Rerouted}}</td><td>{{.MetFailing}} ({{.MetFailingEstimated}})</td></tr>{{end}}</table>
<div class="axis"><span style="left:0">{{time $.From}}</span><span style="left:50%">{{time (mid $.From $.To)}}</span><span style="right:0">{{time $.To}}</span></div>
{{range $rep.Routes}}<h3>{{.Gateway}} / {{.Route}}</h3><div class="band">{{range .Bands}}<span class="span {{.State}}" style="left:{{pct .From $.From $.To}}%;width:{{width .From .To $.From $.To}}%"></span>{{end}}{{range .Failures}}<span class="fail" style="left:{{pct . $.From $.To}}%"></span>{{end}}{{range .Transitions}}<span class="mark {{to .Change}}" title="{{.Change}} {{.Reason}}" style="left:{{pct .At $.From $.To}}%"></span>{{end}}</div>{{end}}
{{end}}{{end}}
<p>"estimated": a request sent to a route that did not serve it live is given that route's latest logged outcome before it.</p>
</body></html>`))

// WriteHTML writes one self-contained page: the tables and, per route, a
// timeline with a marker at each transition.
func (r *Result) WriteHTML(w io.Writer, from, to float64) error {
	return page.Execute(w, map[string]any{"Parts": map[string]*Report{"candidate": r.Candidate, "baseline": r.Baseline}, "From": from, "To": to})
}
