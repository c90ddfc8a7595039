package tracing_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDocsNameEverySpanAndAttribute: docs/tracing.md's table names every
// span, event and attribute of names.go, and nothing else (R-TR2, R-TR3
// fix the names; operators' queries depend on them).
func TestDocsNameEverySpanAndAttribute(t *testing.T) {
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "names.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	code := map[string]bool{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			for i, n := range s.(*ast.ValueSpec).Names {
				if !strings.HasPrefix(n.Name, "Span") && !strings.HasPrefix(n.Name, "Attr") && !strings.HasPrefix(n.Name, "Event") {
					continue
				}
				v, _ := strconv.Unquote(s.(*ast.ValueSpec).Values[i].(*ast.BasicLit).Value)
				code[v] = true
			}
		}
	}
	b, err := os.ReadFile("../../docs/tracing.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	table := doc[strings.Index(doc, "<!-- tracing names -->"):strings.Index(doc, "<!-- /tracing names -->")]
	docs := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(table, -1) {
		docs[m[1]] = true
	}
	for n := range code {
		if !docs[n] {
			t.Errorf("%s is exported but not in docs/tracing.md's table", n)
		}
	}
	for n := range docs {
		if !code[n] {
			t.Errorf("docs/tracing.md names %s, which fusebox never exports", n)
		}
	}
	if len(code) < 20 {
		t.Fatalf("read %d names from names.go", len(code))
	}
}
