//go:build !race

// Not under the race detector: this test is about size, it has no
// concurrency of its own, and under the detector its 600,000 lines took
// 173 s of a loaded 2-core machine's race step (#54). make test runs it
// without the detector, in its "size" step (test/suite.sh).

package replay

import (
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// R-R6 (#54): replay's memory stays bounded whatever the log. Two logs
// that kept every request in flight: 300,000 lines that all start at one
// time, and 300,000 lines each lasting a year. Their outcomes wait for
// their requests' ends, and the queue now holds at most 65,536 of them
// (the rest are recorded early and counted). Before, the queue held every
// one: 3 M such lines from a 5 MB gzip peaked at 3.17 GB, and these two at
// 132 and 136 MiB (265 at 600,000 lines; measured with this test). Held
// here to 96 MiB of heap (they take 52–54: the reorder window's lines and
// the queue), well inside the promise's 256 MiB.
func TestReplayMemoryIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and replays 600,000 lines")
	}
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300_000
	for _, tc := range []struct {
		name       string
		start, dur func(i int) int64 // seconds, ms
	}{
		{"one start time", func(int) int64 { return 1764590400 }, func(int) int64 { return 12 }},
		{"a year each", func(i int) int64 { return 1764590400 + int64(i/1000) }, func(int) int64 { return 365 * 86400 * 1000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log.gz")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			zw := gzip.NewWriter(f)
			for i := range n {
				fmt.Fprintf(zw, `{"start_time":"%d.000","duration_ms":%d,"code":200,"flags":"-","details":"via_upstream","cluster":"ca","gateway":"default","route":"a:r:m","fusebox":{"decision":"d","model":"m","outcome":"success","reason":"success"}}`+"\n",
					tc.start(i), tc.dur(i))
			}
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			var rep *Report
			peak := peakHeap(func() { rep, err = RunErr(rt, &Files{Paths: []string{path}}) })
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("peak heap %d MiB", peak>>20)
			if peak > 96<<20 {
				t.Fatalf("replaying %d lines took %d MiB of heap at once (bound 96 MiB)", n, peak>>20)
			}
			if rep.Lines != n || rep.EarlyOutcomes != n-maxInFlight {
				t.Fatalf("%d lines, %d early outcomes, want %d and %d", rep.Lines, rep.EarlyOutcomes, n, n-maxInFlight)
			}
		})
	}
}
