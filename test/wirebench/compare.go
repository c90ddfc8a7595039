package main

import (
	"fmt"
	"io"
	"time"
)

// Compare measures two fusebox binaries, a and b, in the same alternating
// rounds, both profiles, and returns b's CPU per lifecycle over a's, per
// round: the way to tell whether one change moves the ratio on a machine
// whose speed drifts more between runs than the change is worth
// (make bench-wire's ratios to the null servers are taken the same way).
func Compare(a, b string, requests, rounds, conc int, w io.Writer) (syncRatios, obsRatios []float64, err error) {
	var procs [4]*proc // a sync, b sync, a observer, b observer
	for i, bin := range []string{a, b, a, b} {
		start := startFusebox
		if i >= 2 {
			start = func(bin string, _ ...string) (*proc, error) { return startFuseboxObserver(bin) }
		}
		p, err := start(bin)
		if err != nil {
			return nil, nil, err
		}
		defer p.stop()
		p.observer = i >= 2
		procs[i] = p
	}
	l := newLifecycle()
	for _, p := range procs {
		if _, err := p.drive(l, 200, conc, nil); err != nil {
			return nil, nil, err
		}
	}
	for r := 0; r < rounds; r++ {
		var cpu [4]time.Duration
		// Each pair in both orders, alternately: a run measured second
		// gained up to 6% over the same binary measured first.
		order := []int{0, 1, 2, 3}
		if r%2 == 1 {
			order = []int{1, 0, 3, 2}
		}
		for _, i := range order {
			p := procs[i]
			c0, err := procCPU(p.cmd.Process.Pid)
			if err != nil {
				return nil, nil, err
			}
			if _, err := p.drive(l, requests, conc, nil); err != nil {
				return nil, nil, err
			}
			c1, _ := procCPU(p.cmd.Process.Pid)
			cpu[i] = c1 - c0
		}
		if cpu[0] > 0 && cpu[2] > 0 {
			syncRatios = append(syncRatios, float64(cpu[1])/float64(cpu[0]))
			obsRatios = append(obsRatios, float64(cpu[3])/float64(cpu[2]))
		}
		fmt.Fprintf(w, "round %d: cpu/lifecycle sync a %v b %v, observer a %v b %v\n", r+1,
			(cpu[0] / time.Duration(requests)).Round(100*time.Nanosecond), (cpu[1] / time.Duration(requests)).Round(100*time.Nanosecond),
			(cpu[2] / time.Duration(requests)).Round(100*time.Nanosecond), (cpu[3] / time.Duration(requests)).Round(100*time.Nanosecond))
	}
	fmt.Fprintf(w, "b/a: synchronous %.3fx, observer %.3fx (medians of %d paired rounds)\n", median(syncRatios), median(obsRatios), len(syncRatios))
	return syncRatios, obsRatios, nil
}
