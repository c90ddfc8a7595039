package processor

import (
	"sort"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Decision actions (aig_circuit_breaker_decisions_total{action}).
const (
	ActionRouted      = "routed"
	ActionSkipped     = "skipped"
	ActionRamped      = "ramped" // a route on its recovery ramp passed over (R-D8)
	ActionWouldSkip   = "would_skip"
	ActionTryAll      = "try_all"
	ActionFailFast    = "fail_fast"
	ActionRejected    = "rejected"
	ActionPassthrough = "passthrough"
)

// Selection is the outcome of choosing among a model's candidates.
type Selection struct {
	// Order holds candidate indices to dispatch to, first = chosen; the
	// rest are the fallbacks, in routing order.
	Order []int
	// Skipped holds the indices of candidates left out, in routing order.
	Skipped []int
	// TryAll: nothing was healthy and every candidate (forced-open ones
	// excepted) is kept, Retry-After-blocked ones last (R-F3).
	TryAll bool
	// FailFast: nothing was healthy and the policy says fail_fast; answer
	// 503 with RetryAfterSec.
	FailFast      bool
	RetryAfterSec int64
}

// Select applies R-D2, R-F2, R-F3 and R-D6 to the verdicts of a model's
// candidates (in routing order). dst and skipped are reused buffers; with
// every candidate healthy it does not allocate when they have capacity.
//
// Forced-open candidates are removed first, before the floor and before
// try_all (R-S5). Then at most max_ejection_percent of the remaining
// candidates (rounded down) are skipped; when that ceiling binds, the
// skipped candidates closest to recovery (earliest RecoveryAt, ties in
// routing order) are kept. With none left, try_all keeps every candidate
// but the forced ones, blocked ones last; fail_fast answers 503 with
// retry-after = ceil(seconds to the earliest recovery), at least 1.
func Select(now int64, v []breaker.Verdict, maxEjectionPercent int, whenAllOpen string, dst, skipped []int) Selection {
	sel := Selection{Order: dst[:0], Skipped: skipped[:0]}
	unhealthy, forced := 0, 0
	for i := range v {
		switch {
		case v[i].Forced:
			forced++
		case !v[i].Allowed:
			unhealthy++
		}
	}
	if unhealthy == 0 && forced == 0 {
		for i := range v {
			sel.Order = append(sel.Order, i)
		}
		return sel
	}
	eligible := len(v) - forced
	maxSkip := eligible * maxEjectionPercent / 100
	// Unhealthy candidates re-admitted by the floor.
	readmit := map[int]bool{}
	if unhealthy > maxSkip {
		idx := make([]int, 0, unhealthy)
		for i := range v {
			if !v[i].Forced && !v[i].Allowed {
				idx = append(idx, i)
			}
		}
		sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]].RecoveryAt < v[idx[b]].RecoveryAt })
		for _, i := range idx[:unhealthy-maxSkip] {
			readmit[i] = true
		}
	}
	for i := range v {
		if v[i].Forced || (!v[i].Allowed && !readmit[i]) {
			sel.Skipped = append(sel.Skipped, i)
			continue
		}
		sel.Order = append(sel.Order, i)
	}
	if len(sel.Order) > 0 {
		return sel
	}
	// Nothing left (R-F3).
	if whenAllOpen == breaker.WhenAllOpenFailFast || eligible == 0 {
		sel.FailFast = true
		earliest := int64(breaker.Never)
		for i := range v {
			if v[i].RecoveryAt < earliest {
				earliest = v[i].RecoveryAt
			}
		}
		secs := int64(1)
		if earliest != breaker.Never && earliest > now {
			secs = (earliest - now + 1e9 - 1) / 1e9
		} else if earliest == breaker.Never {
			secs = 60 // forced open without end: ask the client to come back later
		}
		if secs < 1 {
			secs = 1
		}
		sel.RetryAfterSec = secs
		return sel
	}
	sel.TryAll = true
	sel.Skipped = sel.Skipped[:0]
	for i := range v {
		if v[i].Forced {
			sel.Skipped = append(sel.Skipped, i)
		} else if !v[i].Blocked {
			sel.Order = append(sel.Order, i)
		}
	}
	for i := range v {
		if !v[i].Forced && v[i].Blocked {
			sel.Order = append(sel.Order, i)
		}
	}
	return sel
}
