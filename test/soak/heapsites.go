package main

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
)

// heapSites is the live heap by allocation site (the innermost fusebox,
// grpc or go-redis frames of each sampled stack), from the runtime's
// memory profile: when the memory invariant breaks, the sites that grew
// between the two measures are printed with it, so that a failure in CI
// says what grew (the fleet soak's intermittent 13.9 -> 16.7 MiB was
// reported with nothing to go on). The profile is as of the last
// completed collection; settle collects before it reads.
func heapSites() map[string]int64 {
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	out := map[string]int64{}
	for _, r := range recs {
		if r.InUseBytes() == 0 {
			continue
		}
		out[siteOf(r.Stack())] += r.InUseBytes()
	}
	return out
}

// siteOf names a stack by its first three frames outside the runtime and
// the standard library's allocators.
func siteOf(stk []uintptr) string {
	frames := runtime.CallersFrames(stk)
	var names []string
	for {
		f, more := frames.Next()
		fn := f.Function
		if fn != "" && !strings.HasPrefix(fn, "runtime.") && !strings.HasPrefix(fn, "internal/") {
			if i := strings.LastIndex(fn, "/"); i >= 0 {
				fn = fn[i+1:]
			}
			names = append(names, fn)
		}
		if !more || len(names) == 3 {
			break
		}
	}
	return strings.Join(names, " < ")
}

// growth lists the sites that grew most from before to after.
func growth(before, after map[string]int64, top int) string {
	type g struct {
		site string
		d    int64
	}
	var gs []g
	for s, a := range after {
		if d := a - before[s]; d > 0 {
			gs = append(gs, g{s, d})
		}
	}
	slices.SortFunc(gs, func(a, b g) int { return int(b.d - a.d) })
	var b strings.Builder
	for i, x := range gs {
		if i == top {
			break
		}
		fmt.Fprintf(&b, "\n    +%.0f KiB %s", float64(x.d)/1024, x.site)
	}
	return b.String()
}
