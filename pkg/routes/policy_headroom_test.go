package routes

import (
	"fmt"
	"strings"
	"testing"
)

// headroom (R-H2): an object of two whole floors, either optional,
// inherited whole, null turning an inherited one off; anything else is
// refused naming the field and its line.
func TestHeadroomField(t *testing.T) {
	doc := func(gw, model string) string {
		return "gateways:\n  - id: g\n    circuit_breaker: {enabled: true" + gw + "}\n" +
			"    models:\n      - name: m\n        routes: [a:r:m, b:r:m]\n" + model +
			"    routes: [{key: a:r:m, cluster: ca}, {key: b:r:m, cluster: cb}]\n"
	}
	cases := []struct {
		name, gw, model string
		want            string // the effective headroom of model m's first route, or an error's text
	}{
		{"absent is off", "", "", "<nil>"},
		{"both floors", ", headroom: {min_requests: 5, min_tokens: 2000}", "", "&{5 2000}"},
		{"one floor", ", headroom: {min_tokens: 100}", "", "&{0 100}"},
		{"inherited whole, and replaced whole below", ", headroom: {min_requests: 5, min_tokens: 2000}", "        circuit_breaker: {headroom: {min_tokens: 7}}\n", "&{0 7}"},
		{"null turns it off below", ", headroom: {min_requests: 5}", "        circuit_breaker: {headroom: null}\n", "<nil>"},
		{"negative", ", headroom: {min_requests: -1}", "", "circuit_breaker.headroom: min_requests: must be a whole number in 0..1000000000000, got -1 (line 3, gateways[0].circuit_breaker.headroom)"},
		{"unknown field", ", headroom: {max_requests: 1}", "", `circuit_breaker.headroom: unknown field "max_requests"`},
		{"not an object", ", headroom: 5", "", "circuit_breaker.headroom: must be an object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt, err := Parse([]byte(doc(c.gw, c.model)), Options{})
			if strings.HasPrefix(c.want, "circuit_breaker") {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("got %v, want an error with %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, r := range rt.Gateways["g"].Models["m"].Candidates(nil)[:1] {
				got = fmt.Sprint(r.Policy.Headroom)
			}
			if got != c.want {
				t.Fatalf("headroom %s, want %s", got, c.want)
			}
		})
	}
}
