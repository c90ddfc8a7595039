// Command skipreport reads `go test -json` on stdin and writes what a
// plain `go test` run writes (each package's result, the output of every
// failing test), then a list of every skipped test with its reason: a test
// whose tool is missing (redis-server, Chromium, protoc, npm) skips outside
// CI, and `make test` must say so rather than pass quietly. Last come the
// slowest tests, so that a suite grown slow says where its time went. It
// exits 1 when anything failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	buf := map[key][]string{}
	var skipped []string
	var timed []timing
	failed := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			fmt.Fprintln(out, string(line)) // not test2json: a build error, say
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			buf[k] = append(buf[k], e.Output)
		case "skip":
			if e.Test != "" {
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(buf[k])))
			}
			delete(buf, k)
		case "fail":
			failed = true
			if e.Test == "" {
				// A test binary that died (a panic on another goroutine,
				// a signal, an exit) ends its package with no end for
				// the test that was running: that test's output, the
				// crash's included, is all there is to say why. Before,
				// it was dropped, and CI said only "FAIL <package>".
				printUnended(out, buf, e.Package)
			}
			for _, l := range buf[k] {
				if e.Test == "" && (strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- PASS") || strings.HasPrefix(l, "--- SKIP")) {
					continue
				}
				fmt.Fprint(out, l)
			}
			delete(buf, k)
		case "pass":
			if e.Test != "" && !strings.Contains(e.Test, "/") {
				timed = append(timed, timing{e.Package, e.Test, e.Elapsed})
			}
			if e.Test == "" {
				for _, l := range buf[k] {
					if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?") {
						fmt.Fprint(out, l)
					}
				}
			}
			delete(buf, k)
		}
	}
	sort.Strings(skipped)
	if len(skipped) > 0 {
		fmt.Fprintf(out, "\n%d tests skipped:\n", len(skipped))
		for _, s := range skipped {
			fmt.Fprintln(out, "  "+s)
		}
	} else {
		fmt.Fprintln(out, "\nno test skipped")
	}
	printSlowest(out, timed, 8)
	if failed {
		return 1
	}
	return 0
}

// timing is a passed top-level test's time.
type timing struct {
	pkg, test string
	secs      float64
}

// printSlowest lists the n slowest passed tests, slowest first. (A
// failed test's output is above; a subtest's time is its parent's.)
func printSlowest(out io.Writer, timed []timing, n int) {
	if len(timed) == 0 {
		return
	}
	sort.SliceStable(timed, func(i, j int) bool { return timed[i].secs > timed[j].secs })
	fmt.Fprintf(out, "\nslowest tests:\n")
	for _, x := range timed[:min(n, len(timed))] {
		fmt.Fprintf(out, "  %7.1fs %s %s\n", x.secs, x.pkg, x.test)
	}
}

// printUnended writes the output of pkg's tests that started and never
// ended, and forgets it.
func printUnended(out io.Writer, buf map[key][]string, pkg string) {
	var tests []string
	for k := range buf {
		if k.pkg == pkg && k.test != "" {
			tests = append(tests, k.test)
		}
	}
	sort.Strings(tests)
	for _, t := range tests {
		k := key{pkg, t}
		fmt.Fprintf(out, "--- %s did not end: the test binary died while it ran\n", t)
		for _, l := range buf[k] {
			fmt.Fprint(out, l)
		}
		delete(buf, k)
	}
}

// reason is the skip message a test printed (t.Skip's argument).
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "---") || strings.HasPrefix(l, "===") {
			continue
		}
		if _, msg, ok := strings.Cut(l, ".go:"); ok {
			if _, m, ok := strings.Cut(msg, ": "); ok {
				return m
			}
		}
		return l
	}
	return "(no reason given)"
}
