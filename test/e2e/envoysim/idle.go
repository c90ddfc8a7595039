package envoysim

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"
)

// The connection manager's stream idle timeout (docs/envoy.md, "Response
// flags fusebox judges"): a stream with no activity for the route's
// idle_timeout (else the connection manager's stream_idle_timeout, 5 min
// by default) ends. Before response headers it is a local reply, 504 (the
// request was complete) with SI and details stream_idle_timeout; after
// them the stream is reset, SI on the entry. A provider that never sends
// its headers meets it before a longer route timeout.

// errStreamIdle is the cause an idle stream's upstream context ends with.
var errStreamIdle = errors.New("stream idle timeout")

// defaultStreamIdle is the connection manager's stream_idle_timeout
// default.
const defaultStreamIdle = 5 * time.Minute

// streamIdle is the request's idle timeout: the file's, else Envoy's
// default; a negative StreamIdleTimeout (the file set 0s) disables it.
func (p *Proxy) streamIdle() time.Duration {
	switch d := p.cfg.StreamIdleTimeout; {
	case d < 0:
		return 0
	case d == 0:
		return defaultStreamIdle
	default:
		return d
	}
}

// idleWatch is one upstream request's idle timer: it cancels the request's
// context with errStreamIdle when nothing moved for the timeout.
type idleWatch struct {
	d      time.Duration
	mu     sync.Mutex
	t      *time.Timer
	cancel context.CancelCauseFunc
}

// watchIdle derives the upstream request's context from ctx, ended by the
// idle timer (none when the timeout is off).
func (p *Proxy) watchIdle(ctx context.Context) (context.Context, *idleWatch) {
	ictx, cancel := context.WithCancelCause(ctx)
	w := &idleWatch{d: p.streamIdle(), cancel: cancel}
	if w.d > 0 {
		w.t = time.AfterFunc(w.d, func() { cancel(errStreamIdle) })
	}
	return ictx, w
}

// touch restarts the timer: bytes moved.
func (w *idleWatch) touch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t != nil {
		w.t.Reset(w.d)
	}
}

// done stops the timer and releases the context.
func (w *idleWatch) done() {
	w.mu.Lock()
	if w.t != nil {
		w.t.Stop()
	}
	w.mu.Unlock()
	w.cancel(context.Canceled)
}

// idleBody restarts the idle timer on every read that moved bytes, and
// reports errStreamIdle when the timer ended the body.
type idleBody struct {
	io.ReadCloser
	ctx context.Context
	w   *idleWatch
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.w.touch()
	}
	if err != nil && !errors.Is(err, io.EOF) && errors.Is(context.Cause(b.ctx), errStreamIdle) {
		err = errStreamIdle
	}
	return n, err
}

// clientGone is what a request whose client went away before any response
// ends with: no reply is written (there is no one to read it), the entry
// carries DC and code 0 (the connection manager's downstream disconnect).
func clientGone() *response {
	return &response{gone: true, flags: flagDC, details: "downstream_remote_disconnect", body: io.NopCloser(eofReader{})}
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
