package streamlife

import (
	"sync"
	"testing"
	"time"
)

func TestSweepPeriod(t *testing.T) {
	for _, tc := range []struct{ check, want time.Duration }{
		{90 * time.Second, time.Second}, {50 * time.Millisecond, 6250 * time.Microsecond}, {time.Millisecond, time.Millisecond},
	} {
		if got := sweepPeriod(tc.check); got != tc.want {
			t.Errorf("sweepPeriod(%s) = %s, want %s", tc.check, got, tc.want)
		}
	}
}

// BenchmarkStreamBounds is one stream's bounds on fusebox's own transport:
// the sweep's set (Sweep.Run) against the timer per stream it replaced
// (the baseline, as it was written), in the same run.
func BenchmarkStreamBounds(b *testing.B) {
	var s Sweep
	bounds := Bounds{Idle: 360 * time.Second, Max: time.Hour, Refused: func(string) {}}
	run := func(*Activity) error { return nil }
	b.Run("sweep", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = s.Run(bounds, func(error) {}, run, &Activity{})
			}
		})
	})
	b.Run("timer-per-stream", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l := newLifetime(bounds, &Activity{})
				var (
					mu    sync.Mutex
					ended bool
					t     *time.Timer
				)
				t = time.AfterFunc(l.check, func() {
					mu.Lock()
					defer mu.Unlock()
					if !ended {
						_, _ = l.due()
					}
				})
				_ = run(l.act)
				mu.Lock()
				ended = true
				t.Stop()
				mu.Unlock()
			}
		})
	})
}
