package streamlife

import (
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-llm/fusebox/pkg/metrics"
)

// Stream lifetime bounds (R-L13). A stream Envoy never finishes (a lost
// reset, a proxy that forgot it) must not hold a goroutine and its buffers
// for ever: 20,000 such streams held 270 MB.
//
// gRPC gives a server no way to end a stream but to return from its
// handler, and the handler cannot return while it waits in Recv. On
// grpc-go's server the messages are therefore served on a goroutine of
// their own, and the handler watches it (Watch): when the stream
// has had no message for the idle bound, or has lived for the duration
// bound, the handler returns, gRPC cancels the stream, the serving
// goroutine's Recv fails and it ends the stream as it ends a cancelled one
// (a neither, a freed probe slot). fusebox's own transport lends the
// handler a way to end its stream (grpcwire.EndFunc), so there one sweep
// over the live streams checks the same bounds (sweep.go) and the messages
// are served on the handler's own goroutine (Sweep.Run): the handoff
// between two goroutines per stream was 8% of the observer's CPU (make
// bench-wire -compare).

// Activity counts the messages of one stream; the watch compares counts
// instead of reading a clock per message.
type Activity struct{ n atomic.Uint64 }

// Touch counts one message.
func (a *Activity) Touch() { a.n.Add(1) }

// Bounds are a stream's lifetime bounds (limits.max_stream_idle_sec and
// limits.max_stream_duration_sec; zero is no bound); Refused counts a
// stream ended at one (fusebox_refused_total{what}).
type Bounds struct {
	Idle, Max time.Duration
	Refused   func(what string)
}

// lifetime is one stream's bounds and what its checks saw so far. A zero
// bound is no bound.
type lifetime struct {
	refused      func(what string)
	act          *Activity
	idle, maxAge time.Duration
	start        time.Time
	check        time.Duration // the period of the checks
	last         uint64        // the message count at the last check
	quiet        int           // checks in a row that saw no message

	// On fusebox's own transport (timedLifetime, sweep.go): end ends the
	// stream; mu guards ended, set once the stream ended either way (and
	// the checks' fields above). next is when the sweep checks it next
	// (the sweep's alone once added). prev and nextL link it into the
	// sweep's set, under that set's lock.
	end         func(error)
	mu          sync.Mutex
	ended       bool
	next        time.Time
	prev, nextL *lifetime
}

// newLifetime starts a stream's bounds: checked four times per idle
// period, so that an idle stream ends between idle and 1.25 × idle, or at
// maxAge when that is nearer.
func newLifetime(b Bounds, act *Activity) *lifetime {
	idle, maxAge := b.Idle, b.Max
	l := &lifetime{refused: b.Refused, act: act, idle: idle, maxAge: maxAge, start: time.Now(), check: idle / 4, last: act.n.Load()}
	if idle <= 0 || (maxAge > 0 && maxAge < l.check) {
		l.check = maxAge
	}
	return l
}

// due checks the bounds now: the status that ends the stream (counted),
// or nil and the wait before the next check.
func (l *lifetime) due() (time.Duration, error) {
	if l.maxAge > 0 && time.Since(l.start) >= l.maxAge {
		l.refused(metrics.RefusedStreamDuration)
		return 0, status.Errorf(codes.DeadlineExceeded, "fusebox ended a stream older than %s (limits.max_stream_duration_sec)", l.maxAge)
	}
	if l.idle > 0 {
		if n := l.act.n.Load(); n != l.last {
			l.last, l.quiet = n, 0
		} else if l.quiet++; l.quiet >= 4 {
			l.refused(metrics.RefusedStreamIdle)
			return 0, status.Errorf(codes.DeadlineExceeded, "fusebox ended a stream with no message for %s (limits.max_stream_idle_sec)", l.idle)
		}
	}
	next := l.check
	if l.maxAge > 0 {
		next = min(next, l.maxAge-time.Since(l.start))
	}
	return max(next, time.Millisecond), nil
}

// Watch waits for done and returns its result, or ends the stream with
// DeadlineExceeded once a bound is passed (grpc-go's server).
func Watch(b Bounds, done <-chan error, act *Activity) error {
	// One timer per stream, for the nearer of the two bounds' next check;
	// most streams end long before it first fires.
	l := newLifetime(b, act)
	t := time.NewTimer(l.check)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
		}
		next, err := l.due()
		if err != nil {
			return err
		}
		t.Reset(next)
	}
}

// Run runs the stream on this goroutine while the sweep checks its bounds
// (sweep.go), and ends it through end once one is passed (fusebox's own
// transport). A check that comes as the stream ends counts nothing.
func (ls *Sweep) Run(b Bounds, end func(error), run func(act *Activity) error, act *Activity) error {
	l := newLifetime(b, act)
	l.end = end
	ls.add(l)
	defer ls.remove(l)
	return run(act)
}
