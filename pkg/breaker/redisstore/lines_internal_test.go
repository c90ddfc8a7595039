package redisstore

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// lineLog keeps the messages and events a store reports, in order.
type lineLog struct {
	mu  sync.Mutex
	got []string
}

func (l *lineLog) add(s string) { l.mu.Lock(); l.got = append(l.got, s); l.mu.Unlock() }

func (l *lineLog) lines() []string { l.mu.Lock(); defer l.mu.Unlock(); return slices.Clone(l.got) }

func (l *lineLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *lineLog) Handle(_ context.Context, r slog.Record) error {
	l.add(r.Message)
	return nil
}
func (l *lineLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lineLog) WithGroup(string) slog.Handler      { return l }

// A transition the local view made while it was the store is logged before
// the line that ends its stretch, "Redis is reachable again" (#54). The
// fleet soak reads a replica's local chain up to that line; before, a line
// admitted while the store was writing back could be written after it, and
// fell into the next stretch's chain (with Redis's state taken silently
// between): "open->half_open after half_open" (loaded run F4). Here the
// view's own open is held between its admission and its line while the
// store walks back to Redis.
func TestTheViewsLinesStayInsideTheirStretch(t *testing.T) {
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	client, err := NewClient("redis://" + px.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	clk := breaker.NewFakeClock(time.Now())
	log := &lineLog{}
	var hold atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	s := New(Options{Client: client, KeyPrefix: "lines:", OpTimeout: 200 * time.Millisecond, Clock: clk, TestClock: true,
		Log: slog.New(log), OnEvent: func(ev breaker.Event) {
			if ev.DecidedBy != breaker.DecidedByLocal {
				return
			}
			if hold.CompareAndSwap(true, false) {
				close(entered)
				<-release
			}
			log.add("local " + ev.Transition())
		}})
	ctx := context.Background()
	e := installOne(t, s, clk)
	s.Refresh(ctx)
	px.Blackhole(true)
	_, _ = s.Status(ctx, e.lk(), clk.Now().UnixNano())
	if !s.Degraded() {
		t.Fatal("a call Redis did not answer left the store synced")
	}
	px.Blackhole(false)

	hold.Store(true)
	opened := make(chan struct{})
	go func() {
		defer close(opened)
		_ = s.local.ForceOpen(ctx, e.lk(), clk.Now().UnixNano(), time.Minute)
	}()
	<-entered
	refreshed := make(chan struct{})
	go func() { defer close(refreshed); s.Refresh(ctx) }()
	// Held while the walk back runs: before, it logged "reachable again"
	// meanwhile; now it waits for the held line.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && !slices.Contains(log.lines(), reachableLine); {
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	<-opened
	<-refreshed
	got := log.lines()
	own, end := slices.Index(got, "local closed->open"), slices.Index(got, reachableLine)
	if own < 0 || end < 0 || own > end {
		t.Fatalf("lines %q: the view's own open must come before the end of its stretch", got)
	}
}

const reachableLine = "[store] Redis is reachable again: local outcomes and opens written back; the state is read back next"
