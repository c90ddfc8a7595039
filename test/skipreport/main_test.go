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

// A test binary that dies while a test runs (a panic on another
// goroutine, a signal) ends its package with a fail and no end for that
// test: the report prints what the test wrote, the crash included. Before,
// it printed only the package's FAIL line (CI's mainlib failure said
// nothing else).
func TestReportADeadBinary(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA"}`,
		`{"Action":"run","Package":"p","Test":"TestB"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"=== RUN   TestB\n"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"panic: on another goroutine\n"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}`,
		`{"Action":"fail","Package":"p"}`,
	}, "\n")
	var out strings.Builder
	code := run(strings.NewReader(in), &out)
	s := out.String()
	if code != 1 || !strings.Contains(s, "TestB did not end") || !strings.Contains(s, "panic: on another goroutine") || !strings.Contains(s, "FAIL\tp") {
		t.Fatalf("exit %d, report:\n%s", code, s)
	}
}

// The report ends with the slowest passed top-level tests, slowest first;
// subtests and failed tests are not listed there.
func TestReportListsTheSlowest(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"pass","Package":"p","Test":"TestQuick","Elapsed":0.2}`,
		`{"Action":"pass","Package":"p","Test":"TestSlow/case","Elapsed":90}`,
		`{"Action":"pass","Package":"p","Test":"TestSlow","Elapsed":91.5}`,
		`{"Action":"pass","Package":"q","Test":"TestMiddle","Elapsed":12}`,
		`{"Action":"fail","Package":"q","Test":"TestFailed","Elapsed":300}`,
	}, "\n")
	var out strings.Builder
	run(strings.NewReader(in), &out)
	_, slowest, ok := strings.Cut(out.String(), "slowest tests:\n")
	want := "     91.5s p TestSlow\n     12.0s q TestMiddle\n      0.2s p TestQuick\n"
	if !ok || slowest != want {
		t.Fatalf("report:\n%s", out.String())
	}
}
