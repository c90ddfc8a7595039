package processor

import (
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Stream lifetime bounds (R-L13). A stream Envoy never finishes (a lost
// reset, a proxy that forgot it) must not hold a goroutine and its buffers
// for ever: 20,000 such streams held 270 MB.
//
// gRPC gives a server no way to end a stream but to return from its
// handler, and the handler cannot return while it waits in Recv. So the
// messages are served on a goroutine of their own, and the handler watches
// it: when the stream has had no message for the idle bound, or has lived
// for the duration bound, the handler returns, gRPC cancels the stream, the
// serving goroutine's Recv fails and it ends the stream as it ends a
// cancelled one (a neither, a freed probe slot).

// activity counts the messages of one stream; the watch compares counts
// instead of reading a clock per message.
type activity struct{ n atomic.Uint64 }

func (a *activity) touch() { a.n.Add(1) }

// watchLifetime waits for done and returns its result, or ends the stream
// with DeadlineExceeded once it is idle for idle (checked four times per
// idle period, so it ends between idle and 1.25 × idle) or older than max.
// A zero bound is no bound.
func (s *Server) watchLifetime(done <-chan error, act *activity, idle, max time.Duration) error {
	var tick <-chan time.Time
	if idle > 0 {
		t := time.NewTicker(idle / 4)
		defer t.Stop()
		tick = t.C
	}
	var deadline <-chan time.Time
	if max > 0 {
		t := time.NewTimer(max)
		defer t.Stop()
		deadline = t.C
	}
	last, quiet := act.n.Load(), 0
	for {
		select {
		case err := <-done:
			return err
		case <-tick:
			if n := act.n.Load(); n != last {
				last, quiet = n, 0
				continue
			}
			if quiet++; quiet < 4 {
				continue
			}
			s.metrics.Refused.WithLabelValues(metrics.RefusedStreamIdle).Inc()
			return status.Errorf(codes.DeadlineExceeded, "fusebox ended a stream with no message for %s (limits.max_stream_idle_sec)", idle)
		case <-deadline:
			s.metrics.Refused.WithLabelValues(metrics.RefusedStreamDuration).Inc()
			return status.Errorf(codes.DeadlineExceeded, "fusebox ended a stream older than %s (limits.max_stream_duration_sec)", max)
		}
	}
}
