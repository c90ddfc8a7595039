package envoysim

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// The router's retry resource (docs/envoy.md, "Retries at load"): a retry
// is admitted only when the cluster of the request's retry state can
// create one more (RetryStateImpl::shouldRetry:
// resourceManager().retries().canCreate()); otherwise the request is not
// retried (upstream_rq_retry_overflow) and the failed attempt's answer goes
// to the client. An admitted retry holds its slot until the retried
// attempt's outcome (the next shouldRetry, whose resetRetry releases it)
// or the request's end. With a retry_budget the limit is
// max(budget_percent × (active + pending requests), min_retry_concurrency)
// (RetryBudgetImpl), otherwise max_retries (default 3).

type retryCounters struct {
	mu sync.Mutex
	m  map[string]*atomic.Int64
}

func (r *retryCounters) of(cluster string) *atomic.Int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*atomic.Int64{}
	}
	c, ok := r.m[cluster]
	if !ok {
		c = &atomic.Int64{}
		r.m[cluster] = c
	}
	return c
}

// retrySlot is one request's hold on its retry state cluster's resource.
type retrySlot struct {
	p       *Proxy
	cluster string
	held    bool
	retries int // admitted so far
}

// reset is resetRetry: the slot of the previous retry is given back.
func (s *retrySlot) reset() {
	if s.held {
		s.p.retryUse.of(s.cluster).Add(-1)
		s.held = false
	}
}

// take admits one retry, or reports an overflow.
func (s *retrySlot) take() bool {
	s.reset()
	n := s.p.retryUse.of(s.cluster)
	if int(n.Add(1)) > s.p.retryLimit(s.cluster) {
		n.Add(-1)
		s.p.stats.add("upstream_rq_retry_overflow")
		return false
	}
	s.held = true
	s.retries++
	return true
}

// Envoy's retry back-off (route retry_back_off, else base 25 ms, the
// runtime upstream.base_retry_backoff_ms, and max 10 × base): fully
// jittered, retry k waits uniform [0, base·2^(k-1)), the interval capped
// at max (backoff_strategy.cc, JitteredExponentialBackOffStrategy). The
// admitted retry's slot is held while it waits.
const defaultRetryBase = 25 * time.Millisecond

// backoff waits before the retry just admitted; false when ctx ended.
func (s *retrySlot) backoff(ctx context.Context) bool {
	base, most := s.p.cfg.RetryBackOff.Base, s.p.cfg.RetryBackOff.Max
	if base <= 0 {
		base = defaultRetryBase
	}
	if most <= 0 {
		most = 10 * base
	}
	interval := base
	for i := 1; i < s.retries && interval < most; i++ {
		interval *= 2
	}
	interval = min(interval, most)
	t := time.NewTimer(rand.N(interval))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// retryLimit is how many retries cluster admits at once now.
func (p *Proxy) retryLimit(cluster string) int {
	c := p.cfg.Clusters[cluster]
	if c == nil {
		return 3
	}
	if b := c.RetryBudget; b != nil {
		var active int64
		if a := p.active[cluster]; a != nil {
			active = a.Load()
		}
		return max(int(b.Percent/100*float64(active)), b.MinConcurrency)
	}
	switch {
	case c.MaxRetries == NoRetries:
		return 0
	case c.MaxRetries > 0:
		return c.MaxRetries
	}
	return 3
}
