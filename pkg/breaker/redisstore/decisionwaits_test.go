package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// decisionWaits is a go-redis hook that tells, for each decision, the
// deadlines its Redis commands ran under: a decision waits on Redis for
// at most op_timeout when it has no command, or all of them under one
// deadline (a script's EVALSHA and its EVAL after NOSCRIPT share one)
// no later than op_timeout from that command's start.
type decisionWaits struct {
	opTimeout               time.Duration
	waited, overlong, twice atomic.Int64
}

type decisionKey struct{}

type decisionWait struct {
	mu        sync.Mutex
	deadlines map[time.Time]bool
	overlong  bool
}

func (h *decisionWaits) decision(ctx context.Context) (context.Context, *decisionWait) {
	w := &decisionWait{deadlines: map[time.Time]bool{}}
	return context.WithValue(ctx, decisionKey{}, w), w
}

func (h *decisionWaits) done(w *decisionWait) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.deadlines) > 0 {
		h.waited.Add(1)
	}
	if len(w.deadlines) > 1 {
		h.twice.Add(1)
	}
	if w.overlong {
		h.overlong.Add(1)
	}
}

func (h *decisionWaits) note(ctx context.Context) {
	w, ok := ctx.Value(decisionKey{}).(*decisionWait)
	if !ok {
		return // the store's own work (records, refreshes), not a decision's
	}
	d, ok := ctx.Deadline()
	w.mu.Lock()
	defer w.mu.Unlock()
	// The store makes each call's deadline op_timeout from the call; one
	// without a deadline, or past it from now, could hold the decision.
	if !ok || time.Until(d) > h.opTimeout {
		w.overlong = true
	}
	w.deadlines[d] = true
}

func (h *decisionWaits) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *decisionWaits) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note(ctx)
		return next(ctx, cmd)
	}
}

func (h *decisionWaits) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.note(ctx)
		return next(ctx, cmds)
	}
}

// check fails t when a decision could wait on Redis past op_timeout, or
// hung (5 s: a hang, not a slow machine).
func (h *decisionWaits) check(t *testing.T, slowest time.Duration) {
	t.Helper()
	if n := h.overlong.Load(); n != 0 {
		t.Fatalf("%d decisions waited on Redis under a deadline past op_timeout %v, or none", n, h.opTimeout)
	}
	if n := h.twice.Load(); n != 0 {
		t.Fatalf("%d decisions waited on Redis under two deadlines or more (each op_timeout)", n)
	}
	if slowest > 5*time.Second {
		t.Fatalf("a decision hung %v (op_timeout %v)", slowest, h.opTimeout)
	}
}
