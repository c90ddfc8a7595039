package grpcwire

import (
	"runtime"
	"time"
)

// write runs f with the writing side held, and flushes. Goroutines
// queued behind it skip the flush: the last one out flushes for all.
func (c *conn) write(f func() error) error { return c.writeFlush(f, true) }

// writeLater runs f like write but leaves the bytes
// buffered, for the next flush to take with whatever else is written
// meanwhile. Across the streams of one connection that is one write per
// batch, where a flush per reply was a system call each (make bench-wire:
// 4.2 -> 1.3 writes per observer lifecycle). The reader flushes before it
// goes to the socket (flushingReader), so a deferred write waits for one
// buffer of frames at most, unless the reader already waits on the
// socket: then nothing else would flush soon.
//
// A reply is flushed when its stream's handler waits for its next message
// (stream.take, after the goroutines already runnable had their turn to
// add theirs). While the reader waits on the socket, a deferred write goes
// out after flushDelay at the latest (a stream's trailers, a reply whose
// handler blocks elsewhere); any flush stops that timer.
func (c *conn) writeLater(f func() error) error {
	err := c.writeFlush(f, false)
	if err == nil && c.reading.Load() && c.timerArmed.CompareAndSwap(false, true) {
		c.flushTimer.Reset(flushDelay)
	}
	return err
}

// flushDelay bounds how long a deferred reply waits in the buffer: the
// handling of the next message, which is short, unless it blocks.
const flushDelay = 100 * time.Microsecond

func (c *conn) writeFlush(f func() error, flush bool) error {
	c.writers.Add(1)
	c.wmu.Lock()
	err := f()
	if n := c.writers.Add(-1); err == nil {
		switch {
		case flush && n == 0:
			err = c.bw.Flush()
			c.dirty.Store(false)
			if c.timerArmed.Load() && c.timerArmed.CompareAndSwap(true, false) {
				c.flushTimer.Stop()
			}
		case c.bw.Buffered() > 0:
			c.dirty.Store(true)
		}
	}
	c.wmu.Unlock()
	if err != nil {
		c.close(err)
	}
	return err
}

// flushDirty flushes what writeLater left buffered.
func (c *conn) flushDirty() {
	if c.dirty.Load() {
		_ = c.write(func() error { return nil })
	}
}

// deadlineWriter is the connection's write side: every write to the socket
// has a deadline (Options.WriteTimeout), so a peer that stops reading
// fails the connection's writers then, instead of holding them, and every
// stream's end behind them, for ever (#50: the sweep that enforces the
// stream bounds waited behind such a writer for 100 s). The deadline is
// moved on at most every quarter of the timeout (a timer update, not a
// system call, per flush). c.wmu is held, as for any use of bw.
type deadlineWriter struct{ c *conn }

func (w deadlineWriter) Write(p []byte) (int, error) {
	c := w.c
	if d := c.srv.opts.WriteTimeout; d > 0 {
		now := time.Now()
		if now.After(c.wdeadRefresh) {
			_ = c.nc.SetWriteDeadline(now.Add(d))
			c.wdeadRefresh = now.Add(d / 4)
		}
	}
	return c.nc.Write(p)
}

// flushingReader is the connection's read side: before the reader goes
// to the socket for more frames, what writeLater left buffered goes out,
// so a deferred write waits for at most one buffer of frames to be read,
// and shares its system call with every write made while they were.
type flushingReader struct{ c *conn }

func (r flushingReader) Read(p []byte) (int, error) {
	if r.c.woke {
		// The handlers this buffer's frames woke run first: their
		// replies join this flush, and their peer's next frames this
		// read.
		r.c.woke = false
		runtime.Gosched()
	}
	// reading is set before the flush: a writer that leaves bytes
	// buffered after the flush looked sees it, and flushes itself.
	r.c.reading.Store(true)
	r.c.inlineSpent = 0
	r.c.flushDirty()
	n, err := r.c.nc.Read(p)
	r.c.reading.Store(false)
	return n, err
}
