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
// idle period, so it ends between idle and 1.25 × idle) or older than
// maxAge.
// A zero bound is no bound.
func (s *Server) watchLifetime(done <-chan error, act *activity, idle, maxAge time.Duration) error {
	// One timer per stream, for the nearer of the two bounds' next check;
	// most streams end long before it first fires.
	start := time.Now()
	check := idle / 4
	if idle <= 0 || (maxAge > 0 && maxAge < check) {
		check = maxAge
	}
	t := time.NewTimer(check)
	defer t.Stop()
	last, quiet := act.n.Load(), 0
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
		}
		if maxAge > 0 && time.Since(start) >= maxAge {
			s.metrics.Refused.WithLabelValues(metrics.RefusedStreamDuration).Inc()
			return status.Errorf(codes.DeadlineExceeded, "fusebox ended a stream older than %s (limits.max_stream_duration_sec)", maxAge)
		}
		if idle > 0 {
			if n := act.n.Load(); n != last {
				last, quiet = n, 0
			} else if quiet++; quiet >= 4 {
				s.metrics.Refused.WithLabelValues(metrics.RefusedStreamIdle).Inc()
				return status.Errorf(codes.DeadlineExceeded, "fusebox ended a stream with no message for %s (limits.max_stream_idle_sec)", idle)
			}
		}
		next := check
		if maxAge > 0 {
			next = min(next, maxAge-time.Since(start))
		}
		t.Reset(max(next, time.Millisecond))
	}
}
