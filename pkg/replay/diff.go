package replay

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Difference is the candidate less the baseline (R-R5): what the candidate
// config would change, with signs. A negative client_errors is errors
// avoided; a positive opens is the breaker opening more often.
type Difference struct {
	ClientErrors int     `json:"client_errors"`
	Cost         float64 `json:"cost"`
	// HeadroomAvoided429s is the candidate's headroom's 429s avoided less
	// the baseline's (R-H5).
	HeadroomAvoided429s int               `json:"headroom_avoided_429s"`
	Routes              []RouteDifference `json:"routes"`
}

// RouteDifference is one route's difference.
type RouteDifference struct {
	Gateway    string  `json:"gateway"`
	Route      string  `json:"route"`
	Opens      int     `json:"opens"`
	OpenSec    float64 `json:"open_sec"`
	Served     int     `json:"served"`
	MetFailing int     `json:"met_failing"`
	Cost       float64 `json:"cost"`
}

// Diff is cand less base, per route (the routes of either, in the
// candidate's order, then the baseline's others).
func Diff(cand, base *Report) *Difference {
	d := &Difference{ClientErrors: cand.ClientErrors - base.ClientErrors, HeadroomAvoided429s: cand.HeadroomAvoided429s - base.HeadroomAvoided429s,
		Routes: []RouteDifference{}}
	byKey := map[string]*RouteReport{}
	for _, rr := range base.Routes {
		byKey[rr.Gateway+"|"+rr.Route] = rr
	}
	seen := map[string]bool{}
	add := func(c, b *RouteReport) {
		if c == nil {
			c = &RouteReport{Gateway: b.Gateway, Route: b.Route}
		}
		if b == nil {
			b = &RouteReport{}
		}
		rd := RouteDifference{Gateway: c.Gateway, Route: c.Route, Opens: c.Opens - b.Opens, OpenSec: c.OpenSec - b.OpenSec,
			Served: c.Served - b.Served, MetFailing: c.MetFailing - b.MetFailing, Cost: c.Cost - b.Cost}
		d.Cost += rd.Cost
		d.Routes = append(d.Routes, rd)
	}
	for _, c := range cand.Routes {
		k := c.Gateway + "|" + c.Route
		seen[k] = true
		add(c, byKey[k])
	}
	for _, b := range base.Routes {
		if !seen[b.Gateway+"|"+b.Route] {
			add(nil, b)
		}
	}
	return d
}

// writeDiff writes the difference as text, every number with its sign.
func writeDiff(w io.Writer, d *Difference) {
	fmt.Fprintf(w, "candidate - baseline: client errors %+d, cost %+.4f, 429s avoided by headroom %+d\n", d.ClientErrors, d.Cost, d.HeadroomAvoided429s)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  gateway\troute\topens\topen s\tserved\tmet a failing route\tcost")
	for _, rd := range d.Routes {
		fmt.Fprintf(tw, "  %s\t%s\t%+d\t%+.0f\t%+d\t%+d\t%+.4f\n", rd.Gateway, rd.Route, rd.Opens, rd.OpenSec, rd.Served, rd.MetFailing, rd.Cost)
	}
	tw.Flush()
	fmt.Fprintln(w)
}
