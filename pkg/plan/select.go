package plan

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
	ActionSaturated   = "saturated" // a route whose quota headroom is below its floor passed over (R-H2)
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
	// Saturated holds the candidates passed over because their quota
	// headroom is below the floor (R-H2), in routing order: not in Order
	// while another candidate can take the request.
	Saturated []int
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
		sel.passSaturated(v)
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
		sel.passSaturated(v)
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

// passSaturated takes the saturated candidates out of the order while one
// that is not can take the request, as a Retry-After block is skipped
// (R-H2); when every candidate in the order is saturated, none is passed
// over and the least saturated (the earliest end, ties in routing order)
// goes first: saturation is never the reason a model has no route.
func (sel *Selection) passSaturated(v []breaker.Verdict) {
	n := 0
	for _, i := range sel.Order {
		if v[i].Saturated {
			n++
		}
	}
	switch {
	case n == 0:
		return
	case n == len(sel.Order):
		sort.SliceStable(sel.Order, func(a, b int) bool { return v[sel.Order[a]].SaturatedUntil < v[sel.Order[b]].SaturatedUntil })
		return
	}
	kept := sel.Order[:0]
	for _, i := range sel.Order {
		if v[i].Saturated {
			sel.Saturated = append(sel.Saturated, i)
			continue
		}
		kept = append(kept, i)
	}
	sel.Order = kept
}

// Plan is route selection as one pure function (SPEC R-DL9): the
// candidates' verdicts, the policy and the ramp's draw in, the order to
// dispatch in out. Live decisions (decide.go) and extproc replay use it,
// so a what-if report routes as fusebox does; admission (the probe slot)
// and the reply's encoding are separate steps.
type Plan struct {
	Selection
	// Start is where dispatch begins in Order: the routes before it are
	// on their recovery ramp and were passed over (R-D8), listed in Ramped.
	Start  int
	Ramped []int
}

// Ramp is what the plan needs of the recovery ramp: Share(i) is candidate
// i's share of its traffic (per mille; 0 = not ramping) and Draw(i) this
// request's draw for it (0..999, RampDraw).
type Ramp interface {
	Share(i int) uint16
	Draw(i int) uint16
}

// PlanRoutes selects (Select) and then applies the recovery ramp: a
// ramping route whose draw is at or above its share is passed over, but
// only to a later candidate that can take the request by its own health
// (Allowed: closed and admitted, or half-open with a free slot), never to
// one the capacity floor or try_all re-admitted while it is unhealthy.
// Before, 90 of 100 requests right after a close went to routes the floor
// had re-admitted while they were open.
func PlanRoutes(now int64, v []breaker.Verdict, maxEjectionPercent int, whenAllOpen string, ramp Ramp, dst, skipped []int) Plan {
	p := Plan{Selection: Select(now, v, maxEjectionPercent, whenAllOpen, dst, skipped)}
	if p.FailFast || p.TryAll || ramp == nil {
		return p
	}
	for p.Start < len(p.Order)-1 {
		i := p.Order[p.Start]
		r := ramp.Share(i)
		if r == 0 || ramp.Draw(i) < r {
			break
		}
		next := healthyAfter(v, p.Order, p.Start+1)
		if next < 0 {
			break
		}
		// Passed over to the next candidate that can take it; those in
		// between (re-admitted while unhealthy) are not tried for it.
		p.Ramped = append(p.Ramped, i)
		p.Start = next
	}
	return p
}

// healthyAfter is the position in order, from from on, of the first
// candidate that can take a request by its own health; -1 when none can.
func healthyAfter(v []breaker.Verdict, order []int, from int) int {
	for k := from; k < len(order); k++ {
		if j := order[k]; v[j].Allowed && !v[j].Forced {
			return k
		}
	}
	return -1
}
