package judge

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// The latency baseline of R-T6: per route, the p50 of its successes over
// the last 15 minutes, from fixed log-spaced histograms — bounded memory
// whatever the traffic (15 × 64 counters, about 4 KiB a route).
//
// Buckets grow by 25 % from 1 ms (bucket i covers [1.25^i, 1.25^(i+1)) ms,
// the last one everything above ~21 minutes); the p50 is reported at its
// bucket's geometric middle, so it is within ±12 % of the true median.
const (
	baselineMinutes  = 15
	baselineBuckets  = 64
	baselineGrowth   = 1.25
	baselineMinCount = 20
)

type Baselines struct {
	mu sync.RWMutex
	m  map[breaker.ID]*Baseline
}

// Baseline is one route's histograms. The record path touches it with
// atomics only (a counter, and the cached p50); the p50 is recomputed under
// mu at most once a second.
type Baseline struct {
	minute [baselineMinutes]atomic.Int64 // which minute each row holds
	counts [baselineMinutes][baselineBuckets]atomic.Uint32
	mu     sync.Mutex
	// cache is the last p50 (ms, high 32 bits) and the unix second it was
	// computed in (low 32 bits): one atomic load on the record path.
	cache atomic.Uint64
	// held is the recovery ramp share (per mille, +1; 0 = none) held while
	// the route is slower than its baseline allows (R-D8).
	held atomic.Uint32
}

// recentMinCount is how many successes the last two minutes need before
// their median speaks for the route's recent latency.
const recentMinCount = 5

// RecentP50 is the median of the route's successes over this minute and
// the last (ms), 0 when there are too few.
func (x *Baseline) RecentP50(now int64) int64 {
	cur := now / 60e9
	var sum [baselineBuckets]uint64
	var total uint64
	for r := 0; r < baselineMinutes; r++ {
		m := x.minute[r].Load()
		if cur-m > 1 || m > cur {
			continue
		}
		for i := range x.counts[r] {
			c := uint64(x.counts[r][i].Load())
			sum[i] += c
			total += c
		}
	}
	if total < recentMinCount {
		return 0
	}
	half, seen := (total+1)/2, uint64(0)
	for i, c := range sum {
		seen += c
		if seen >= half {
			return int64(math.Round(math.Pow(baselineGrowth, float64(i)+0.5)))
		}
	}
	return 0
}

// RampShare is the share a ramping route takes now (R-D8): the breaker's,
// except that while the route's recent p50 is above its baseline ×
// multiplier the share stops growing (it is held where it was when the
// slowness began), so a provider that came back slow does not get more.
func (x *Baseline) RampShare(share uint16, mult float64, now int64) uint16 {
	base, recent := x.P50(now), x.RecentP50(now)
	if base <= 0 || recent <= 0 || float64(recent) <= mult*float64(base) {
		x.held.Store(0)
		return share
	}
	h := x.held.Load()
	if h == 0 {
		x.held.CompareAndSwap(0, uint32(share)+1)
		return share
	}
	return min(share, uint16(h-1))
}

func NewBaselines() *Baselines { return &Baselines{m: map[breaker.ID]*Baseline{}} }

// Get returns the route's histograms, creating them.
func (b *Baselines) Get(id breaker.ID) *Baseline {
	b.mu.RLock()
	x := b.m[id]
	b.mu.RUnlock()
	if x != nil {
		return x
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if x = b.m[id]; x == nil {
		x = &Baseline{}
		b.m[id] = x
	}
	return x
}

// bucketBounds[i] is the lowest latency (ms) of bucket i+1.
var bucketBounds = func() (out [baselineBuckets - 1]int64) {
	for i := range out {
		out[i] = int64(math.Ceil(math.Pow(baselineGrowth, float64(i+1))))
	}
	return
}()

func bucketOf(ms int64) int {
	if ms <= 1 {
		return 0
	}
	// log1.25(ms) = log2(ms) × 3.106: start just below from the bit
	// length, then step up to the first bound above ms.
	i := (bits.Len64(uint64(ms)) - 1) * 3106 / 1000
	i = max(i-3, 0)
	for i < len(bucketBounds) && bucketBounds[i] <= ms {
		i++
	}
	return i
}

func (b *Baselines) Add(id breaker.ID, ms, now int64) { b.Get(id).Add(ms, now) }

// Add records one success's latency at now.
func (x *Baseline) Add(ms, now int64) {
	if ms < 0 {
		return
	}
	minute := now / 60e9
	row := minute % baselineMinutes
	if old := x.minute[row].Load(); old != minute && x.minute[row].CompareAndSwap(old, minute) {
		// A new minute takes the row over. A count racing the reset can be
		// lost; the baseline is a statistic, not a ledger.
		for i := range x.counts[row] {
			x.counts[row][i].Store(0)
		}
	}
	x.counts[row][bucketOf(ms)].Add(1)
}

func (b *Baselines) P50(id breaker.ID, now int64) int64 {
	b.mu.RLock()
	x := b.m[id]
	b.mu.RUnlock()
	if x == nil {
		return 0
	}
	return x.P50(now)
}

// P50 returns the route's baseline in ms at now, 0 before
// baselineMinCount successes in the last 15 minutes. It is recomputed once
// per second of the clock.
func (x *Baseline) P50(now int64) int64 {
	sec := uint64(now / 1e9)
	if c := x.cache.Load(); c != 0 && c&0xffffffff == sec&0xffffffff {
		return int64(c >> 32)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	cur := now / 60e9
	var sum [baselineBuckets]uint64
	var total uint64
	for r := 0; r < baselineMinutes; r++ {
		m := x.minute[r].Load()
		if cur-m >= baselineMinutes || m > cur {
			continue
		}
		for i := range x.counts[r] {
			c := uint64(x.counts[r][i].Load())
			sum[i] += c
			total += c
		}
	}
	var v int64
	if total >= baselineMinCount {
		half, seen := (total+1)/2, uint64(0)
		for i, c := range sum {
			if seen += c; seen >= half {
				v = int64(math.Round(math.Pow(baselineGrowth, float64(i)+0.5)))
				break
			}
		}
	}
	x.cache.Store(uint64(v)<<32 | sec&0xffffffff)
	return v
}

// Retain drops the baselines of routes a reload removed.
func (b *Baselines) Retain(keep map[breaker.ID]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id := range b.m {
		if !keep[id] {
			delete(b.m, id)
		}
	}
}
