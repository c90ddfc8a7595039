package routes

import (
	"errors"
	"strings"
	"testing"
)

// Every problem names its line and YAML path, the ones found after
// decoding (a duplicate, an unknown reference) as much as the decoder's;
// an unknown key lists the known ones in one format, with the closest one
// when it looks like a typo. Before, a duplicate route and a model naming
// an unknown route had no line and no path, and an unknown
// circuit_breaker field listed nothing.
func TestProblemsNameLineAndPath(t *testing.T) {
	const doc = `gateways:
  - id: default
    circuit_breaker: {enabled: true, failure_treshold: 3}
    models:
      - name: gpt
        routes: [a:b:c, a:b:d]
    routes:
      - {key: a:b:c, cluster: c1}
      - {key: a:b:c, cluster: c2}
      - {key: q:r:s, clustr: c3}
`
	_, err := Parse([]byte(doc), Options{})
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("not refused: %v", err)
	}
	all := strings.Join(ce.Problems, "\n")
	for _, want := range []string{
		`key: defined twice (line 9, gateways[0].routes[1].key)`,
		`"a:b:d" is not a route of this gateway; did you mean "a:b:c"? (line 6, gateways[0].models[0].routes[1])`,
		`unknown field "failure_treshold" in a circuit_breaker (known: `,
		`did you mean "failure_threshold"?) (line 3, gateways[0].circuit_breaker.failure_treshold)`,
		`line 10: unknown field "clustr" in a route (known: `,
		`did you mean "cluster"?)`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no problem contains %q; got:\n%s", want, all)
		}
	}
	for _, p := range ce.Problems {
		if !strings.Contains(p, "line ") {
			t.Errorf("a problem without its line: %s", p)
		}
	}
}

func TestDidYouMean(t *testing.T) {
	cases := []struct{ got, want string }{
		{"clustr", `; did you mean "cluster"?`},
		{"failure_treshold", `; did you mean "failure_threshold"?`},
		{"zzzzzz", ""},
		{"cluster", ""}, // itself: not a typo
	}
	for _, tc := range cases {
		if got := didYouMean(tc.got, []string{"cluster", "failure_threshold", "key"}); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.got, got, tc.want)
		}
	}
}

// Bad indentation is reported at the line that has it, not at the start of
// the block go-yaml gave up on (before: "line 2: did not find expected
// key" for a stray indent on line 6).
func TestBadIndentationLine(t *testing.T) {
	cases := []struct{ doc, want string }{
		{"gateways:\n  - id: default\n    models:\n      - name: gpt\n        routes: [a:b:c]\n     routes:\n      - {key: a:b:c, cluster: c1}\n", "line 6: bad indentation"},
		{"gateways:\n  - id: default\n    models:\n      - name: gpt\n          routes: [a:b:c]\n", "line 5: bad indentation"},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.doc), Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.doc, err, tc.want)
		}
	}
}

// "did you mean" is bounded: a 60 KB unknown name costs nothing (before,
// the edit distance of two 60 KB names took minutes under -race).
func TestDidYouMeanBounded(t *testing.T) {
	long := strings.Repeat("n", 60<<10)
	if got := didYouMean(long, []string{long + "x", "cluster"}); got != "" {
		t.Fatalf("a suggestion for a 60 KB name: %.40q", got)
	}
	if got := didYouMean("clustr", []string{long, "cluster"}); got != `; did you mean "cluster"?` {
		t.Fatalf("a long known name stopped the suggestion: %q", got)
	}
}
