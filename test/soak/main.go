package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"io"
	"os"
	"runtime"
	"sort"
	"time"
)

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

func main() {
	requests := flag.Int("requests", 200000, "client requests")
	conc := flag.Int("concurrency", 32, "concurrent clients")
	rate := flag.Int("rate", 500, "requests per second (0 = unpaced)")
	faults := flag.Bool("faults", true, "run the fault schedule")
	every := flag.Duration("fault-every", 3*time.Second, "pause between fault steps")
	envoy := flag.String("envoy", "envoy/envoy.yaml", "the shipped Envoy config")
	release := flag.String("envoy-version", "1.40", "the Envoy release envoysim plays: 1.36 (local replies hidden from ext_proc) or 1.40")
	warm := flag.Bool("warmup-faults", true, "run the fault schedule once in the warm-up, before the baseline of goroutines and memory")
	redis := flag.Bool("redis", false, "run fusebox on the Redis store (a redis-server started here) and kill and restart Redis in the schedule")
	flag.Parse()
	if os.Getenv("SOAK_PROFILE_DIR") != "" {
		runtime.MemProfileRate = 1 // every allocation: the profiles are exact, the run slower
	}
	rep, err := Run(Options{Requests: *requests, Concurrency: *conc, Rate: *rate, Faults: *faults, FaultEvery: *every, EnvoyYAML: *envoy, Redis: *redis, WarmupFaults: *warm,
		Envoy: map[string]envoysim.Version{"1.36": envoysim.Envoy136, "1.40": envoysim.Envoy140}[*release]})
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	if len(rep.Failed()) > 0 {
		os.Exit(1)
	}
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "soak: %d requests in %v (%.0f/s), store %s\n", r.Requests, r.Duration.Round(time.Second), float64(r.Requests)/r.Duration.Seconds(), r.Store)
	fmt.Fprintf(w, "client answers by status: %v\n", sortedInts(r.ByStatus))
	if len(r.Errors) > 0 {
		fmt.Fprintf(w, "client-visible transport errors: %v\n", r.Errors)
	}
	fmt.Fprintf(w, "outcomes by class: %v\n", r.Outcomes)
	fmt.Fprintf(w, "transitions: %d; faults injected: %v, seen to take effect: %v; cut short by the load's end before a request met them: %v\n", r.Transitions, r.Faults, r.FaultEffects, r.CutShort)
	fmt.Fprintf(w, "decision latency (request_body message): p50 %v, p99 %v, p99.9 %v\n", r.DecisionP50, r.DecisionP99, r.DecisionP999)
	fmt.Fprintf(w, "Envoy's longest wait for a request-path reply %v; ext_proc message timeouts (Envoy went on without fusebox) %d\n", r.LongestWait, r.EnvoyGaveUp)
	fmt.Fprintf(w, "peak RSS %.1f MiB, peak goroutines %d; before/after load: goroutines %d/%d, live heap %.2f/%.2f MiB, RSS %.1f/%.1f MiB\n",
		float64(r.PeakRSS)/(1<<20), r.PeakGoroutines, r.Before.goroutines, r.After.goroutines, float64(r.Before.heap)/(1<<20), float64(r.After.heap)/(1<<20),
		float64(r.Before.rss)/(1<<20), float64(r.After.rss)/(1<<20))
	for _, c := range r.Invariants {
		mark := "held"
		if !c.Held {
			mark = "BROKEN"
		}
		fmt.Fprintf(w, "  [%s] %s — %s\n", mark, c.Name, c.Detail)
	}
	if len(r.BrokenChain) > 0 {
		fmt.Fprintf(w, "the first broken chain's log (its breaker's and the store's lines):\n")
		for _, l := range r.BrokenChain {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
}

func sortedInts(m map[int]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%d:%d ", k, m[k])
	}
	return s
}
