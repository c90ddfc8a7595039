package bench

import (
	"fmt"
	"os"
	"slices"
	"testing"
)

// TestPeerRatios (FUSEBOX_FIGURES=1) runs fusebox's breaker and its peers
// in one process, rounds alternating, and prints each one's median ns/op
// and allocations over the rounds with its ratio to fusebox's: the
// decision alone, and decide + record (issue #39). Elsewhere it is
// skipped: a timing belongs in a benchmark run, not in the suite.
func TestPeerRatios(t *testing.T) {
	if os.Getenv("FUSEBOX_FIGURES") == "" {
		t.Skip("FUSEBOX_FIGURES=1 prints fusebox's breaker against gobreaker v2 and failsafe-go")
	}
	const rounds = 7
	groups := []struct {
		name  string
		cases []struct {
			name string
			fn   func(*testing.B)
		}
	}{
		{"decision", []struct {
			name string
			fn   func(*testing.B)
		}{{"fusebox (coarse clock)", BenchmarkFuseboxDecisionCoarseClock}, {"fusebox (time.Now)", BenchmarkFuseboxDecision}, {"gobreaker v2", BenchmarkGobreakerAllow}, {"failsafe-go", BenchmarkFailsafePermit}}},
		{"decide + record", []struct {
			name string
			fn   func(*testing.B)
		}{{"fusebox (coarse clock)", BenchmarkFuseboxDecideRecordCoarseClock}, {"fusebox (time.Now)", BenchmarkFuseboxDecideRecord},
			{"gobreaker v2", BenchmarkGobreakerAllowDone}, {"failsafe-go", BenchmarkFailsafePermitRecord}}},
	}
	for _, g := range groups {
		ns := make([][]float64, len(g.cases))
		allocs := make([]int64, len(g.cases))
		for range rounds {
			for i, c := range g.cases {
				r := testing.Benchmark(c.fn)
				ns[i] = append(ns[i], float64(r.T.Nanoseconds())/float64(r.N))
				allocs[i] = r.AllocsPerOp()
			}
		}
		median := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
		base := median(ns[0])
		fmt.Printf("%s (median of %d rounds)\n", g.name, rounds)
		for i, c := range g.cases {
			m := median(ns[i])
			fmt.Printf("  %-24s %7.1f ns/op  %d allocs/op  %.2fx fusebox  (rounds %.1f..%.1f)\n", c.name, m, allocs[i], m/base,
				slices.Min(ns[i]), slices.Max(ns[i]))
		}
	}
}
