package storetest

import (
	"slices"
	"testing"
)

// Every rule of SPEC §5 has a vector, and every vector names one of them.
func TestVectorsCoverSection5(t *testing.T) {
	vs, err := Vectors()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range vs {
		if !slices.Contains(Section5, v.Rule) {
			t.Errorf("vectors.txt:%d names %q, not a rule of §5", v.Line, v.Rule)
		}
		if _, err := v.policy(); err != nil {
			t.Errorf("vectors.txt:%d: %v", v.Line, err)
		}
		seen[v.Rule] = true
	}
	for _, r := range Section5 {
		if !seen[r] {
			t.Errorf("no vector for %s", r)
		}
	}
}
