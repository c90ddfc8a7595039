package envoysim

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestFactsIndexNamesRealTests: every test docs/envoy.md's facts index says
// holds a fact exists in the repository, so the index cannot name a test
// that was renamed or never written.
func TestFactsIndexNamesRealTests(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- facts index -->\n")
	table, _, ok2 := strings.Cut(rest, "<!-- end of facts index -->")
	if !ok || !ok2 {
		t.Fatal("docs/envoy.md has no facts index markers")
	}
	defined := map[string]bool{}
	re := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir("../../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, named := 0, 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 6 || strings.HasPrefix(strings.TrimSpace(cells[1]), "fact") || strings.HasPrefix(cells[1], "---") {
			continue
		}
		rows++
		for _, m := range regexp.MustCompile(`Test\w+`).FindAllString(cells[4], -1) {
			named++
			if !defined[m] {
				t.Errorf("the facts index names %s, which no test file defines", m)
			}
		}
	}
	if rows < 30 || named < rows-2 {
		t.Fatalf("the facts index has %d rows naming %d tests", rows, named)
	}
}

// TestTheFactsIndexCanBeRead: docs/envoy.md is the index (under 15 KB),
// the facts in full in the pages of docs/envoy/ it lists, each of which
// exists; no table row, in the index or a page, is over 300 characters
// (#51). Before, the one file
// was 55 KB with rows up to 2,260 characters.
func TestTheFactsIndexCanBeRead(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(doc) >= 15<<10 {
		t.Errorf("docs/envoy.md is %d bytes: the index must stay under 15 KB", len(doc))
	}
	for i, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "|") && len(line) > 300 {
			t.Errorf("docs/envoy.md:%d: a table row of %d characters (at most 300)", i+1, len(line))
		}
	}
	pages := regexp.MustCompile(`\]\((envoy/[a-z0-9-]+\.md)\)`).FindAllStringSubmatch(string(doc), -1)
	if len(pages) < 10 {
		t.Fatalf("docs/envoy.md links %d pages", len(pages))
	}
	for _, m := range pages {
		page, err := os.ReadFile("../../../docs/" + m[1])
		if err != nil {
			t.Errorf("docs/envoy.md links %s: %v", m[1], err)
			continue
		}
		for i, line := range strings.Split(string(page), "\n") {
			if strings.HasPrefix(line, "|") && len(line) > 300 {
				t.Errorf("docs/%s:%d: a table row of %d characters (at most 300)", m[1], i+1, len(line))
			}
		}
	}
}
