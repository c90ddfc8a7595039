package replay

import (
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// writeGzipLog writes n lines (synthetic's shape, route a failing from
// failAt) to a gzip file without holding them.
func writeGzipLog(t testing.TB, path string, n, failAt int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	for i := 0; i < n; i++ {
		code, outcome, reason := 200, "success", "success"
		if i >= failAt {
			code, outcome, reason = 503, "failure", "provider_5xx"
		}
		fmt.Fprintf(zw, `{"start_time":"%d.%03d","duration_ms":12,"ttfb_ms":9,"code":%d,"flags":"-","details":"via_upstream","cluster":"ca","attempts":1,"gateway":"default","route":"a:r:m","fusebox":{"decision":"d%d","model":"m","outcome":%q,"reason":%q}}`+"\n",
			1764590400+i/10, (i%10)*100, code, i, outcome, reason)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// peakHeap runs fn and reports the largest heap seen while it ran, with
// the collector run often (GOGC 10), so that what it sees is close to the
// live heap rather than garbage not yet collected.
func peakHeap(fn func()) uint64 {
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	fn()
	close(stop)
	wg.Wait()
	return peak.Load()
}

// TestMemoryDoesNotGrowWithTheLog (#37, R-R6): replay reads the files as
// it replays, so its memory is bounded whatever the input: with a reorder
// window of 4,096 lines, 20,000 and 60,000 lines peak within 8 MiB of
// each other (the default window, 65,536 lines, holds about 20 MiB of
// them: far under 256 MiB). Before, every line was held (a 5 MB gzip took
// 3.09 GB; here 12.3 MiB for 20,000 lines and 56.2 MiB for 100,000).
func TestMemoryDoesNotGrowWithTheLog(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and replays 80,000 lines")
	}
	dir := t.TempDir()
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	peaks := map[int]uint64{}
	for _, n := range []int{20000, 60000} {
		path := filepath.Join(dir, fmt.Sprintf("%d.log.gz", n))
		writeGzipLog(t, path, n, n/2)
		src := &Files{Paths: []string{path}, Window: 4096}
		var rep *Report
		peaks[n] = peakHeap(func() {
			if rep, err = RunErr(rt, src); err != nil {
				t.Error(err)
			}
		})
		if rep.Lines != n || src.Malformed != 0 {
			t.Fatalf("%d lines: replayed %d, %d malformed", n, rep.Lines, src.Malformed)
		}
		t.Logf("%d lines: peak live heap %.1f MiB", n, float64(peaks[n])/(1<<20))
	}
	small, big := peaks[20000], peaks[60000]
	if big > small+8<<20 || big > 256<<20 {
		t.Fatalf("peak live heap %.1f MiB for 20,000 lines, %.1f MiB for 60,000", float64(small)/(1<<20), float64(big)/(1<<20))
	}
}

// TestFilesMergeInTimeOrder: lines of two files, and lines a little out of
// order within a file, replay in time order.
func TestFilesMergeInTimeOrder(t *testing.T) {
	dir := t.TempDir()
	line := func(sec int) string {
		return fmt.Sprintf(`{"start_time":"%d.000","duration_ms":1,"code":200,"cluster":"ca","gateway":"default","route":"a:r:m","fusebox":{"decision":"d","model":"m","outcome":"success","reason":"success"}}`+"\n", sec)
	}
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	_ = os.WriteFile(a, []byte(line(10)+line(12)+line(11)+line(14)), 0o600)
	_ = os.WriteFile(b, []byte(line(9)+line(13)), 0o600)
	src := &Files{Paths: []string{a, b}}
	var got []int64
	if err := src.Each(func(l *Line) { got = append(got, l.At/1e9) }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[9 10 11 12 13 14]" || src.OutOfOrder != 0 || src.First != 9e9 || src.Last != 14e9 {
		t.Fatalf("%v, out of order %d, first %d last %d", got, src.OutOfOrder, src.First, src.Last)
	}
}

// A line older than the reorder window holds is replayed at the time of
// the line before it, and counted: time never runs backwards in the
// engine.
func TestLateLineKeepsTimeForward(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "late.log")
	var b []byte
	for i := 0; i < 300; i++ {
		b = append(b, fmt.Sprintf(`{"start_time":"%d.000","duration_ms":1,"code":200,"cluster":"ca","gateway":"default","route":"a:r:m"}`+"\n", 100+i)...)
	}
	b = append(b, `{"start_time":"1.000","duration_ms":1,"code":200,"cluster":"ca","gateway":"default","route":"a:r:m"}`+"\n"...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	src := &Files{Paths: []string{path}, Window: 256}
	var prev int64
	backwards := false
	if err := src.Each(func(l *Line) {
		backwards = backwards || l.At < prev
		prev = l.At
	}); err != nil {
		t.Fatal(err)
	}
	if backwards || src.OutOfOrder != 1 || src.Lines != 301 {
		t.Fatalf("backwards %v, out of order %d, %d lines", backwards, src.OutOfOrder, src.Lines)
	}
}

// BenchmarkReplayFiles is replay as the CLI runs it (#39: at least 10 M
// lines a minute on one core, under 256 MiB): a gzip file of 200,000 lines
// read through Files with the default reorder window. lines/min and the
// peak live heap are the figures (run with -cpu 1).
func BenchmarkReplayFiles(b *testing.B) {
	const n = 200000
	path := filepath.Join(b.TempDir(), "log.gz")
	writeGzipLog(b, path, n, n/2)
	rt, err := routes.Parse([]byte(cfg), routes.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var ms runtime.MemStats
	var peak uint64
	b.ReportAllocs()
	for b.Loop() {
		rep, err := RunErr(rt, &Files{Paths: []string{path}})
		if err != nil || rep.Lines != n {
			b.Fatal(err, rep.Lines)
		}
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapSys)
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Minutes(), "lines/min")
	b.ReportMetric(float64(peak)/(1<<20), "heap-sys-MiB")
}

// Lines of one time replay in the order they were read (the window's heap
// is not stable by itself).
func TestLinesOfOneTimeKeepTheirOrder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "same.log")
	var b []byte
	for i := 0; i < 500; i++ {
		b = fmt.Appendf(b, `{"start_time":"1764590400.000","code":200,"fusebox":{"decision":"d%d","model":"m"}}`+"\n", i)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := (&Files{Paths: []string{path}}).Each(func(l *Line) {
		if want := fmt.Sprintf("d%d", n); l.Decision != want && !t.Failed() {
			t.Errorf("line %d replayed as %s", n, l.Decision)
		}
		n++
	}); err != nil || n != 500 {
		t.Fatal(err, n)
	}
}
