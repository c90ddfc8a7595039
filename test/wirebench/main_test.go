package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A short run of the whole measurement: both servers start, every
// lifecycle completes, and the report has its figures.
func TestWirebenchRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := t.TempDir()
	fb, nl := filepath.Join(dir, "extproc"), filepath.Join(dir, "nullproc")
	for bin, pkg := range map[string]string{fb: "github.com/fusebox-llm/fusebox/cmd/extproc", nl: "github.com/fusebox-llm/fusebox/test/wirebench/nullproc"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	rep, err := Run(fb, nl, 300, 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Result{rep.Null, rep.Fusebox, rep.NullTuned} {
		if r.Requests != 300 || len(r.Latencies) != 300*53 || r.CPU <= 0 {
			t.Fatalf("%s: %d requests, %d latencies, cpu %v", r.Name, r.Requests, len(r.Latencies), r.CPU)
		}
	}
	// The observer profile: only the two request-path messages wait.
	for _, o := range []*Result{rep.Observer, rep.NullObserver} {
		if o.Requests != 300 || len(o.Latencies) != 300*2 || o.CPU <= 0 {
			t.Fatalf("%s: %d requests, %d latencies, cpu %v", o.Name, o.Requests, len(o.Latencies), o.CPU)
		}
	}
	var b bytes.Buffer
	rep.Print(&b)
	if !strings.Contains(b.String(), "fusebox/null: cpu") || !strings.Contains(b.String(), "observer/null: cpu") ||
		!strings.Contains(b.String(), "observer/null-obs") || !strings.Contains(b.String(), "over null-wire") {
		t.Fatalf("report:\n%s", b.String())
	}
}
