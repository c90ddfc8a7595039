// Package layout holds the repository's shape to what the packages'
// doc.go files say: which fusebox packages each may import.
package layout

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/fusebox-llm/fusebox/"

// rank is each package's layer: a package imports only fusebox packages
// of a strictly lower rank, so dependencies point one way (the roles →
// lifecycle, judge, plan → breaker) and no two packages of one layer
// know each other. A package missing here fails the test: a new one is
// placed on purpose.
var rank = map[string]int{
	"proto/replica/v1":                 0,
	"pkg/breaker":                      0,
	"pkg/breaker/redisstore/redistest": 0,
	"pkg/echo":                         0,
	"pkg/metrics":                      0,
	"pkg/grpcwire":                     0,
	"pkg/streamlife":                   1,
	"pkg/tlsfiles":                     0,
	"pkg/tlsfiles/tlstest":             0,
	"pkg/tracing":                      0,
	"pkg/tracing/otlptest":             0,
	"pkg/routes":                       1,
	"pkg/extproc":                      1,
	"pkg/lifecycle":                    1,
	"pkg/judge/classify":               1,
	"pkg/transitions":                  1,
	"pkg/breaker/storetest":            1,
	"pkg/breaker/redisstore":           1,
	"pkg/judge":                        2,
	"pkg/plan":                         2,
	"pkg/routes/shared":                2,
	"pkg/processor":                    3,
	"pkg/admin":                        3,
	"pkg/replay":                       3,
	"cmd/extproc/mainlib":              4,
	// The simulate subcommand runs the scripted outage of test/e2e.
	"test/e2e/simulate": 4,
	"cmd/extproc":       5,
}

// only narrows a package's imports further than its rank: the leaves the
// doc.go files promise.
var only = map[string][]string{
	"pkg/grpcwire":  {},              // the transport knows nothing of fusebox
	"pkg/tracing":   {},              // spans from plain values: it knows no breaker
	"pkg/extproc":   {"pkg/echo"},    // the wire: client text echoed in error bodies
	"pkg/lifecycle": {"pkg/breaker"}, // the decision's rules and its note store
	"pkg/judge":     {"pkg/breaker", "pkg/extproc"},
	"pkg/plan":      {"pkg/breaker", "pkg/extproc", "pkg/routes"},
}

// violations lists every import of graph (package → fusebox imports) that
// points back, sideways, or outside what only allows.
func violations(graph map[string][]string) []string {
	var out []string
	for pkg, imps := range graph {
		r, ok := rank[pkg]
		if !ok {
			out = append(out, fmt.Sprintf("%s has no rank: place it in layout's table", pkg))
			continue
		}
		for _, imp := range imps {
			ri, ok := rank[imp]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s imports %s, which has no rank", pkg, imp))
			case ri >= r:
				out = append(out, fmt.Sprintf("%s (rank %d) imports %s (rank %d): dependencies point down only", pkg, r, imp, ri))
			}
			if allowed, narrowed := only[pkg]; narrowed && !contains(allowed, imp) {
				out = append(out, fmt.Sprintf("%s imports %s; it may import only %v", pkg, imp, allowed))
			}
		}
	}
	sort.Strings(out)
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// productGraph reads the fusebox imports of every package's product files
// (tests may import what they need to test) under pkg/, cmd/ and proto/.
func productGraph(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	graph := map[string][]string{}
	fset := token.NewFileSet()
	for _, top := range []string{"pkg", "cmd", "proto"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			pkg := filepath.ToSlash(rel)
			if _, ok := graph[pkg]; !ok {
				graph[pkg] = nil
			}
			for _, is := range f.Imports {
				p, _ := strconv.Unquote(is.Path.Value)
				if imp, ok := strings.CutPrefix(p, module); ok && !contains(graph[pkg], imp) {
					graph[pkg] = append(graph[pkg], imp)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return graph
}

// TestImportDirection: every product package imports only what its layer
// allows (#51). Its own cases show it fails on a back-import.
func TestImportDirection(t *testing.T) {
	graph := productGraph(t)
	if len(graph) < 15 {
		t.Fatalf("read only %d packages: is the test run from test/layout?", len(graph))
	}
	if _, ok := graph["pkg/processor"]; !ok {
		t.Fatal("pkg/processor not found")
	}
	for _, v := range violations(graph) {
		t.Error(v)
	}
}

func TestImportDirectionCatchesABackImport(t *testing.T) {
	for _, tc := range []struct {
		name  string
		graph map[string][]string
		want  string
	}{
		{"judge imports the processor", map[string][]string{"pkg/judge": {"pkg/breaker", "pkg/processor"}}, "pkg/judge (rank 2) imports pkg/processor (rank 3)"},
		{"the breaker imports routes", map[string][]string{"pkg/breaker": {"pkg/routes"}}, "pkg/breaker (rank 0) imports pkg/routes (rank 1)"},
		{"replay imports the processor", map[string][]string{"pkg/replay": {"pkg/processor"}}, "pkg/replay (rank 3) imports pkg/processor (rank 3)"},
		{"the transport imports the breaker", map[string][]string{"pkg/grpcwire": {"pkg/breaker"}}, "pkg/grpcwire (rank 0) imports pkg/breaker (rank 0)"},
		{"lifecycle imports metrics", map[string][]string{"pkg/lifecycle": {"pkg/metrics"}}, "pkg/lifecycle imports pkg/metrics; it may import only [pkg/breaker]"},
		{"a package with no rank", map[string][]string{"pkg/newthing": nil}, "pkg/newthing has no rank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(violations(tc.graph), "\n")
			if !strings.Contains(got, tc.want) {
				t.Fatalf("violations:\n%s\nwant one containing %q", got, tc.want)
			}
		})
	}
	// And the real graph with one back-import added fails.
	graph := productGraph(t)
	graph["pkg/judge"] = append(graph["pkg/judge"], "pkg/processor")
	if len(violations(graph)) == 0 {
		t.Fatal("a back-import passed")
	}
}

// TestEveryPackageSaysWhatItOwns: each product package has a doc.go.
func TestEveryPackageSaysWhatItOwns(t *testing.T) {
	for pkg := range productGraph(t) {
		if strings.HasPrefix(pkg, "proto/") {
			continue // generated
		}
		if _, err := os.Stat(filepath.Join("../..", pkg, "doc.go")); err != nil {
			t.Errorf("%s has no doc.go", pkg)
		}
	}
}
