package redisstore

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStoreImportsNothingAbove: the store knows breakers and bytes, not
// the config. The overlay documents reach it through breaker's backend
// interface (breaker/overlays.go); before, it imported pkg/routes, the one
// arrow in the house that pointed up.
func TestStoreImportsNothingAbove(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			for _, up := range []string{"/pkg/routes", "/pkg/processor", "/pkg/admin", "/cmd/"} {
				if strings.Contains(p, "fusebox-llm/fusebox"+up) {
					t.Errorf("%s imports %s", f, p)
				}
			}
		}
	}
}
