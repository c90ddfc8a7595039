package grpcwire

import (
	"errors"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// resetStream ends a stream on our side with RST_STREAM code.
func (c *conn) resetStream(id uint32, code http2.ErrCode, cause error) {
	c.mu.Lock()
	st := c.streams[id]
	c.mu.Unlock()
	if st != nil {
		st.abort(cause, true, code)
		return
	}
	_ = c.write(func() error { return c.fr.WriteRSTStream(id, code) })
}

// goAway tells the peer the connection is ending with code.
func (c *conn) goAway(code http2.ErrCode, msg string) {
	c.mu.Lock()
	last := c.lastID
	c.goAwaySent = true
	c.mu.Unlock()
	_ = c.write(func() error {
		if c.fr == nil {
			return nil // no preface yet: nothing to tell (writeReady)
		}
		return c.fr.WriteGoAway(last, code, []byte(msg))
	})
}

// drain starts a graceful close: GOAWAY with the largest id and a PING;
// once its ack comes every stream the peer opened before it is known, and
// a second GOAWAY names the last one (as grpc-go does, so that a stream
// in flight is not refused). The connection ends with its last stream.
func (c *conn) drain() {
	c.mu.Lock()
	if c.closed || c.drainPingSent {
		c.mu.Unlock()
		return
	}
	c.drainPingSent = true
	c.goAwaySent = true
	c.mu.Unlock()
	var data [8]byte
	copy(data[:], drainPingData)
	ready := true
	_ = c.write(func() error {
		if c.fr == nil {
			ready = false
			return nil
		}
		if err := c.fr.WriteGoAway(1<<31-1, http2.ErrCodeNo, nil); err != nil {
			return err
		}
		return c.fr.WritePing(false, data)
	})
	if !ready {
		// The peer has not sent its preface: it has no stream to finish,
		// and the HTTP/2 framing a GOAWAY needs is not set up yet. Before,
		// the drain wrote through a nil framer and the process panicked
		// (TestStress: GracefulStop while a peer was connecting).
		c.close(errors.New("the server is draining: the connection had not sent its preface"))
		return
	}
	// A peer that never acks the ping still gets closed once idle.
	time.AfterFunc(5*time.Second, func() {
		c.mu.Lock()
		c.maxID = c.lastID
		n := len(c.streams)
		c.mu.Unlock()
		if n == 0 {
			c.close(errDrained)
		}
	})
}

// close ends the connection and every stream on it.
func (c *conn) close(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	sts := make([]*stream, 0, len(c.streams))
	for _, st := range c.streams {
		sts = append(sts, st)
	}
	if c.keepaliveTimer != nil {
		c.keepaliveTimer.Stop()
	}
	c.flushTimer.Stop()
	c.cond.Broadcast()
	c.mu.Unlock()
	c.stop()
	c.flushBeforeClose(err == errDrained)
	_ = c.nc.Close()
	for _, st := range sts {
		st.abort(status.Error(codes.Unavailable, "the connection closed"), false, 0)
	}
}

// errDrained ends a connection that went away gracefully with its last
// stream: its close waits for a writer in progress (flushBeforeClose).
var errDrained = errors.New("drained")

// flushBeforeClose sends what writeLater left buffered (the last stream's
// trailers, when a drained connection ends with its last stream). On a
// drained close (wait) a writer that holds the writing side is waited
// for, up to a second; any other close (Stop, a broken connection) goes on
// at once: one that is
// blocked on a peer that stopped reading must not hold the close, but one
// that is not must finish before the socket closes under it. Before, the
// close went on at once, and a writer mid-flush lost the last stream's
// trailers (TestStops/graceful on a loaded CI machine: the client saw the
// connection end instead of its status). A peer that stopped reading gets
// a second.
func (c *conn) flushBeforeClose(wait bool) {
	if !c.dirty.Load() {
		return
	}
	for deadline := time.Now().Add(time.Second); !c.wmu.TryLock(); time.Sleep(time.Millisecond) {
		if !wait || time.Now().After(deadline) {
			return
		}
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.wdeadRefresh = time.Now().Add(time.Hour) // this second stands
	_ = c.bw.Flush()
	c.dirty.Store(false)
	c.wmu.Unlock()
}

// streamEnded removes a stream; the connection ends with its last one
// once it is going away.
func (c *conn) streamEnded(st *stream) {
	st.mu.Lock()
	st.charge(0) // its unfinished message, if any, is no longer held
	st.mu.Unlock()
	c.mu.Lock()
	delete(c.streams, st.id)
	n := len(c.streams)
	if n == 0 {
		c.idleSince = time.Now()
	}
	done := n == 0 && c.maxID < 1<<31-1 && c.goAwaySent
	c.cond.Broadcast()
	c.mu.Unlock()
	if done {
		c.close(errDrained)
	}
}

// watch runs keepalive and the idle close on one timer. Activity is
// seen at the tick's resolution (a quarter of the shorter period): the
// tick compares the count of frames read with the last tick's.
func (c *conn) watch() {
	o := c.srv.opts
	every := min(o.KeepaliveTime, o.MaxConnectionIdle) / 4
	lastActive, lastReads := time.Now(), c.reads.Load()
	var pingSentAt time.Time
	var readsAtPing uint64
	var tick func()
	tick = func() {
		now := time.Now()
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		idle := len(c.streams) == 0 && now.Sub(c.idleSince) >= o.MaxConnectionIdle
		c.mu.Unlock()
		if idle {
			c.drain()
		}
		n := c.reads.Load()
		if n != lastReads {
			lastReads, lastActive = n, now
		}
		pinged := !pingSentAt.IsZero()
		switch {
		case pinged && n == readsAtPing && now.Sub(pingSentAt) >= o.KeepaliveTimeout:
			c.close(errors.New("keepalive: the peer did not answer a ping"))
			return
		case now.Sub(lastActive) >= o.KeepaliveTime && (!pinged || n != readsAtPing):
			pingSentAt, readsAtPing = now, n
			var data [8]byte
			copy(data[:], keepalivePingData)
			// Off this goroutine: a write that blocks must not stop the
			// timeout from closing the connection.
			go c.write(func() error { return c.fr.WritePing(false, data) })
		}
		c.mu.Lock()
		if !c.closed {
			c.keepaliveTimer = time.AfterFunc(every, tick)
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.keepaliveTimer = time.AfterFunc(every, tick)
	c.mu.Unlock()
}
