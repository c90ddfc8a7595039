package processor

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/streamlife"
)

// The sweep that checks the stream bounds on fusebox's own transport
// (sweep.go): it ends the streams past a bound, each once and counted
// once; a stream that ends first is never ended by it; it stops when no
// stream is left, and starts again with the next one.
func TestTheSweepEndsOnlyStreamsPastTheirBound(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.StreamIdle = 200 * time.Millisecond })
	s := e.srv
	var ended atomic.Int64
	var wg sync.WaitGroup
	// 50 streams that end at once, 20 that idle until the sweep ends
	// them, and 20 that keep talking until they end by themselves.
	for i := range 90 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop := make(chan error, 1)
			end := func(err error) { ended.Add(1); stop <- err }
			_ = s.lives.Run(s.bounds, end, func(act *streamlife.Activity) error {
				switch {
				case i < 50:
					return nil
				case i < 70:
					return <-stop
				default:
					for range 10 {
						act.Touch()
						time.Sleep(15 * time.Millisecond)
					}
					return nil
				}
			}, &streamlife.Activity{})
		}()
	}
	wg.Wait()
	if n := ended.Load(); n != 20 {
		t.Fatalf("the sweep ended %d streams, want the 20 idle ones", n)
	}
	if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(metrics.RefusedStreamIdle)); v != 20 {
		t.Fatalf("%s counted %v, want 20", metrics.RefusedStreamIdle, v)
	}
	eventually(t, "the sweep stops with no stream left", func() bool {
		return s.lives.Idle()
	})
	// The next stream starts it again.
	stop := make(chan error, 1)
	err := s.lives.Run(s.bounds, func(err error) { stop <- err }, func(*streamlife.Activity) error { return <-stop }, &streamlife.Activity{})
	if err == nil {
		t.Fatalf("an idle stream after the sweep stopped ended with %v", err)
	}
}

// #50: the sweep never waits on a connection. A stream whose end blocks
// (its connection's writer is stuck behind a peer that stopped reading)
// does not hold up the ends of other streams past their bound. Before,
// the sweep ended streams one after another on its own goroutine: idle
// streams with a 5 s bound ended after 103–105 s behind such a peer.
func TestTheSweepNeverWaitsOnAStream(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.StreamIdle = 100 * time.Millisecond })
	s := e.srv
	stuck := make(chan struct{})
	defer close(stuck)
	go func() {
		stop := make(chan error, 1)
		_ = s.lives.Run(s.bounds, func(err error) { <-stuck; stop <- err }, func(*streamlife.Activity) error { return <-stop }, &streamlife.Activity{})
	}()
	// The others start later, so that the sweep reaches the stuck one
	// first (its bound is due first).
	time.Sleep(40 * time.Millisecond)
	start := time.Now()
	var ended atomic.Int64
	for range 5 {
		go func() {
			stop := make(chan error, 1)
			_ = s.lives.Run(s.bounds, func(err error) { ended.Add(1); stop <- err }, func(*streamlife.Activity) error { return <-stop }, &streamlife.Activity{})
		}()
	}
	// The bound is 100 ms, checked every 12.5 ms; a sweep stuck on the
	// first stream never reaches these.
	eventually(t, "the 5 idle streams ended", func() bool { return ended.Load() == 5 })
	t.Logf("5 idle streams ended in %v beside a stream whose end blocks", time.Since(start))
}
