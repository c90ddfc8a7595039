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

// withOrigin is a transition's reason, with its evidence's origin when it
// has one (R-FD1): "connection_error, local"; a replica's own view's
// transition says whose (R-FD3): "connection_error, local, replica pod-a".
func withOrigin(t Transition) string {
	s := t.Reason
	if t.Origin != "" {
		s += ", " + t.Origin
	}
	if t.Replica != "" {
		s += ", replica " + t.Replica
	}
	return s
}

// whose reports whether rep judged any failure local, upstream, held or
// the request's (R-FD5): its table is written then.
func whose(rep *Report) bool {
	for _, rr := range rep.Routes {
		if rr.LocalFailures+rr.UpstreamFailures+rr.RequestFaults+rr.ReplicaOpens > 0 {
			return true
		}
	}
	return false
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
		if rep.EarlyOutcomes > 0 {
			fmt.Fprintf(w, "  %d outcomes were recorded before their request ended: more than %d requests were in flight at once, what replay holds (R-R6)\n",
				rep.EarlyOutcomes, maxInFlight)
		}
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
		if whose(rep) {
			// Whose failures they were (R-FD5): the route's, this
			// replica's egress, or the request's own.
			tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  gateway\troute\tlocal failures (held for a quorum)\tupstream failures (the request's own)\treplica-scoped opens")
			for _, rr := range rep.Routes {
				fmt.Fprintf(tw, "  %s\t%s\t%d (%d)\t%d (%d)\t%d\n", rr.Gateway, rr.Route, rr.LocalFailures, rr.HeldForQuorum, rr.UpstreamFailures, rr.RequestFaults, rr.ReplicaOpens)
			}
			tw.Flush()
		}
		for _, rr := range rep.Routes {
			for _, t := range rr.Transitions {
				fmt.Fprintf(w, "  %s %s/%s %s (%s)\n", rfc3339(t.At), rr.Gateway, rr.Route, t.Change, withOrigin(t))
			}
		}
		fmt.Fprintln(w)
	}
	if whose(r.Candidate) || (r.Baseline != nil && whose(r.Baseline)) {
		fmt.Fprintln(w, `"held for a quorum": a failure Envoy originated (no answer came) that counted for its replica's own view of the route`)
		fmt.Fprintln(w, `until enough replicas saw such failures (local_origin_quorum); "the request's own": a failure of one request sent again`)
		fmt.Fprintln(w, `with the same answer while the route answered others (request_fault_ttl_sec).`)
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
	"time":       rfc3339,
	"withOrigin": withOrigin,
	"whose":      whose,
	"signed":     func(v int) string { return fmt.Sprintf("%+d", v) },
	"signed0":    func(v float64) string { return fmt.Sprintf("%+.0f", v) },
	"signedf":    func(v float64) string { return fmt.Sprintf("%+.4f", v) },
	"mid":        func(a, b float64) float64 { return (a + b) / 2 },
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
.axis{position:relative;width:900px;height:1.2rem;font-size:12px;color:#555}.axis span{position:absolute}.open{background:#b00020}.half_open{background:#b35900}.closed{background:#1a7f37}
.note{color:#444;margin:.1rem 0}.legend{font-size:12px;color:#444;margin:.6rem 0}.key{display:inline-block;width:12px;height:10px;margin:0 .2rem 0 .6rem;vertical-align:middle}.failmark{background:#b00020;width:2px}.markkey{background:#333;width:2px}</style></head><body>
<h1>fusebox replay</h1>
{{with .Difference}}<h2>What the candidate changes</h2>
<p>candidate − baseline: client errors {{signed .ClientErrors}}, cost {{signedf .Cost}}, 429s avoided by headroom {{signed .HeadroomAvoided429s}}.</p>
<table><tr><th>gateway</th><th>route</th><th>opens</th><th>open s</th><th>served</th><th>met a failing route</th><th>cost</th></tr>
{{range .Routes}}<tr><td>{{.Gateway}}</td><td>{{.Route}}</td><td>{{signed .Opens}}</td><td>{{signed0 .OpenSec}}</td><td>{{signed .Served}}</td><td>{{signed .MetFailing}}</td><td>{{signedf .Cost}}</td></tr>{{end}}</table>
{{end}}
{{range .Parts}}{{$rep := .Rep}}<h2>{{.Name}}</h2>
<p>{{$rep.Lines}} lines ({{$rep.Malformed}} malformed, skipped; {{$rep.Skipped}} for a gateway or model it lacks), {{$rep.ClientErrors}} client errors ({{$rep.ClientErrorsEstimated}} of them estimated).</p>
{{range $rep.MalformedExamples}}<p class="note">malformed: {{.}}</p>{{end}}
<p>Next to what happened ({{$rep.LiveClientErrors}} client errors, cost {{printf "%.4f" $rep.LiveCost}}): {{$rep.Avoided}} client errors avoided, {{$rep.Added}} added.</p>
{{if $rep.EarlyOutcomes}}<p class="note">{{$rep.EarlyOutcomes}} outcomes were recorded before their request ended: more requests were in flight at once than replay holds (R-R6).</p>{{end}}
{{if $rep.HeadroomMoved}}<p>Headroom: {{$rep.HeadroomMoved}} requests moved off a route whose quota was nearly gone, {{$rep.HeadroomAvoided429s}} of them 429s avoided.</p>{{end}}
<table><tr><th>gateway</th><th>model</th><th>route</th><th>opens</th><th>open s</th><th>served</th><th>routed elsewhere</th><th>met a failing route (estimated)</th><th>cost (estimated)</th></tr>
{{range $rep.Routes}}<tr><td>{{.Gateway}}</td><td>{{.Model}}</td><td>{{.Route}}</td><td>{{.Opens}}</td><td>{{printf "%.0f" .OpenSec}}</td><td>{{.Served}}</td><td>{{.Rerouted}}</td><td>{{.MetFailing}} ({{.MetFailingEstimated}})</td><td>{{printf "%.4f" .Cost}} ({{printf "%.4f" .CostEstimated}})</td></tr>{{end}}</table>
{{if whose $rep}}<h3>Whose failures</h3>
<table><tr><th>gateway</th><th>route</th><th>local failures (held for a quorum)</th><th>upstream failures (the request's own)</th><th>replica-scoped opens</th></tr>
{{range $rep.Routes}}<tr><td>{{.Gateway}}</td><td>{{.Route}}</td><td>{{.LocalFailures}} ({{.HeldForQuorum}})</td><td>{{.UpstreamFailures}} ({{.RequestFaults}})</td><td>{{.ReplicaOpens}}</td></tr>{{end}}</table>{{end}}
{{range $rr := $rep.Routes}}{{range .Transitions}}<p class="note">{{time .At}} {{$rr.Gateway}}/{{$rr.Route}} {{.Change}} ({{withOrigin .}})</p>{{end}}{{end}}
<div class="legend"><span class="key closed"></span>closed <span class="key half_open"></span>half-open <span class="key open"></span>open <span class="key failmark"></span>a request that met a failing route <span class="key markkey"></span>a transition (hover for its reason)</div>
<div class="axis"><span style="left:0">{{time $.From}}</span><span style="left:50%">{{time (mid $.From $.To)}}</span><span style="right:0">{{time $.To}}</span></div>
{{range $rep.Routes}}<h3>{{.Gateway}} / {{.Route}}</h3><div class="band">{{range .Bands}}<span class="span {{.State}}" style="left:{{pct .From $.From $.To}}%;width:{{width .From .To $.From $.To}}%"></span>{{end}}{{range .Failures}}<span class="fail" style="left:{{pct . $.From $.To}}%"></span>{{end}}{{range .Transitions}}{{if not .Replica}}<span class="mark {{to .Change}}" title="{{.Change}} {{.Reason}}" style="left:{{pct .At $.From $.To}}%"></span>{{end}}{{end}}</div>{{end}}
{{end}}
<p>"held for a quorum": a failure Envoy originated (no answer came) that counted for its replica's own view of the route until enough replicas saw such failures (local_origin_quorum); "the request's own": a failure of one request sent again with the same answer while the route answered others (request_fault_ttl_sec).</p>
<p>"estimated": a request the config sent to a route that did not serve it live has no recorded outcome there; it is given that route's latest logged outcome before it (else a success), and the tokens it used where it did go.</p>
</body></html>`))

// WriteHTML writes one self-contained page: the tables and, per route, a
// timeline with a marker at each transition.
//
// It shows what the text shows, in the same order (R-R5): the difference
// first when there is a baseline, then each config's counts, what it
// avoided and added next to what happened, its routes with their cost,
// its transitions, and the timelines with a legend. Before, the page had
// no difference, no avoided or added errors, no cost and no transitions
// list, and put the baseline first.
func (r *Result) WriteHTML(w io.Writer, from, to float64) error {
	r.diff()
	type part struct {
		Name string
		Rep  *Report
	}
	parts := []part{{"candidate", r.Candidate}}
	if r.Baseline != nil {
		parts = append(parts, part{"baseline", r.Baseline})
	}
	return page.Execute(w, map[string]any{"Difference": r.Difference, "Parts": parts, "From": from, "To": to})
}
