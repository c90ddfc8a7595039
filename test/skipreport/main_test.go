package main

import (
	"strings"
	"testing"
)

// The report passes results through, lists each skip with its reason, and
// fails when a test failed.
func TestReport(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:9: redis-server is not installed\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:3: boom\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB"}`,
		`{"Action":"output","Package":"q","Output":"ok  \tq\t0.1s\n"}`,
		`{"Action":"pass","Package":"q"}`,
	}, "\n")
	var out strings.Builder
	code := run(strings.NewReader(in), &out)
	s := out.String()
	if code != 1 || !strings.Contains(s, "boom") || !strings.Contains(s, "ok  \tq") ||
		!strings.Contains(s, "1 tests skipped:\n  p TestA: redis-server is not installed") {
		t.Fatalf("exit %d, report:\n%s", code, s)
	}
}
