package grpcwire

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The HTTP/2 limits this server reads and writes with.
const (
	maxFrameSize      = 16 << 10 // the default; we advertise no larger
	maxHeaderListSize = 1 << 20
	prefaceTimeout    = 10 * time.Second
	drainPingData     = "fbdrain1"
	keepalivePingData = "fbalive1"
)

// conn is one HTTP/2 connection. Its serve goroutine reads every frame;
// any goroutine writes through write, which serializes and shares flushes.
type conn struct {
	srv  *Server
	nc   net.Conn
	fr   *http2.Framer
	br   *bufio.Reader // fr's read side, which readLoop peeks DATA frames in
	ctx  context.Context
	stop context.CancelFunc

	// Writing: wmu guards fr's writing side, bw, henc and hbuf. writers
	// counts goroutines in or waiting for write: the last one flushes.
	wmu     sync.Mutex
	writers atomic.Int32
	// dirty: bytes are buffered and unflushed (writeLater); flushTimer
	// flushes them after flushDelay, armed while timerArmed.
	dirty      atomic.Bool
	timerArmed atomic.Bool
	flushTimer *time.Timer
	// timerFlushes counts the timer's firings (tests: it is a backstop).
	timerFlushes atomic.Int64
	// reading: the reader is in, or about to be in, a read of the socket
	// (flushingReader), and flushes nothing until it has read.
	reading atomic.Bool
	bw      *bufio.Writer
	// wdeadRefresh: when deadlineWriter moves the write deadline on next.
	wdeadRefresh time.Time
	henc         *hpack.Encoder
	hbuf         bytes.Buffer

	// mu guards the rest; cond waits for send window (broadcast when a
	// window grows, a stream ends or the connection closes).
	mu            sync.Mutex
	cond          *sync.Cond
	streams       map[uint32]*stream
	lastID        uint32 // the highest stream id the peer opened
	maxID         uint32 // streams above it are refused (after GOAWAY)
	closed        bool
	connSend      int64  // the peer's connection window for our DATA
	peerWindow    int32  // the peer's initial stream window
	peerMaxFrame  uint32 // the peer's SETTINGS_MAX_FRAME_SIZE
	idleSince     time.Time
	goAwaySent    bool
	drainPingSent bool
	pingStrikes   int
	lastPing      time.Time
	// sentSincePing: the server wrote headers or data since the peer's
	// last ping (it resets the ping strikes, as grpc-go's does).
	sentSincePing  atomic.Bool
	reads          atomic.Uint64 // frames read (keepalive compares counts: a clock read per frame cost 5%)
	keepaliveTimer *time.Timer

	// Read side, owned by serve: the connection window's unacknowledged
	// bytes.
	connUnacked int32
	// woke: the reader handed a stream work since its last read.
	woke bool
	// inlineSpent: the time inline functions took on the reader since it
	// last went to the socket (inline.go's budget).
	inlineSpent time.Duration
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{srv: s, nc: nc, streams: map[uint32]*stream{}, connSend: 65535, peerWindow: 65535, peerMaxFrame: maxFrameSize, maxID: 1<<31 - 1,
		idleSince: time.Now()}
	c.cond = sync.NewCond(&c.mu)
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.bw = bufio.NewWriterSize(deadlineWriter{c}, 32<<10)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.flushTimer = time.AfterFunc(time.Hour, func() {
		c.timerFlushes.Add(1)
		c.timerArmed.Store(false)
		c.flushDirty()
	})
	c.flushTimer.Stop()
	return c
}

// serve runs the connection: handshake, then frames until it ends.
func (c *conn) serve() {
	defer c.srv.forget(c)
	err := c.handshake()
	if err == nil {
		c.watch()
		err = c.readLoop()
	}
	c.close(err)
}

func (c *conn) handshake() error {
	_ = c.nc.SetDeadline(time.Now().Add(prefaceTimeout))
	if cfg := c.srv.opts.TLS; cfg != nil {
		tc := tls.Server(c.nc, cfg)
		if err := tc.Handshake(); err != nil {
			return fmt.Errorf("tls handshake: %w", err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			return fmt.Errorf("tls: the client did not negotiate h2 (ALPN %q)", p)
		}
		c.nc = tc // deadlineWriter writes to it from now on
	}
	br := bufio.NewReaderSize(flushingReader{c}, 32<<10)
	pre := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, pre); err != nil {
		return fmt.Errorf("reading the client preface: %w", err)
	}
	if string(pre) != http2.ClientPreface {
		return errors.New("not an HTTP/2 client preface")
	}
	_ = c.nc.SetDeadline(time.Time{})
	// The framer is set with the writing side held: a drain (GracefulStop)
	// may write on this connection from another goroutine at any time, and
	// finds no framer until the preface came (writeReady).
	fr := http2.NewFramer(c.bw, br)
	fr.SetReuseFrames()
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = maxHeaderListSize
	fr.SetMaxReadFrameSize(maxFrameSize)
	c.wmu.Lock()
	c.br, c.fr = br, fr
	c.wmu.Unlock()
	o := c.srv.opts
	return c.write(func() error {
		if err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: o.MaxConcurrentStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(o.StreamWindow)},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
		); err != nil {
			return err
		}
		return c.fr.WriteWindowUpdate(0, uint32(o.ConnWindow-65535))
	})
}

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

// readLoop reads frames until the connection fails or ends.
// peerAwayGrace is how long a connection whose peer sent GOAWAY with
// nothing open is still read.
const peerAwayGrace = 500 * time.Millisecond

func (c *conn) readLoop() error {
	for {
		if ok, err := c.readData(); ok {
			if err != nil {
				return c.handleErr(err)
			}
			continue
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				// A stream's own error (a malformed header field in the
				// HEADERS that opened it): that stream is reset, and its id
				// counts as used, so that the DATA the peer already sent
				// for it is dropped as a closed stream's. Before, the id
				// stayed idle and that DATA ended the whole connection
				// (GOAWAY), every other stream of that Envoy worker with it.
				c.mu.Lock()
				if se.StreamID%2 == 1 && se.StreamID > c.lastID {
					c.lastID = se.StreamID
				}
				c.mu.Unlock()
				c.resetStream(se.StreamID, se.Code, status.Error(codes.Internal, se.Error()))
				continue
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.goAway(http2.ErrCode(ce), err.Error())
			}
			return err
		}
		c.reads.Add(1)
		if err := c.handle(f); err != nil {
			return err
		}
	}
}

// errConn is a connection error: GOAWAY with its code, then close.
type errConn struct {
	code http2.ErrCode
	msg  string
}

func (e errConn) Error() string { return fmt.Sprintf("http2 %v: %s", e.code, e.msg) }

// readData reads a DATA frame in place, when the next frame is a plain
// one: in the read buffer, its messages are cut out of it with no copy
// into a frame first (make bench-wire: the Framer's header and payload
// reads were a tenth of the observer's CPU, DATA frames 53 of a
// lifecycle's 57). Anything else (another type, padding, stream 0, over
// the frame size, an incomplete frame at the connection's end) is left to
// the Framer, which reads it, or says what is wrong with it, as before.
// ok says the frame was read here; err is then what handling it returned.
func (c *conn) readData() (ok bool, err error) {
	hdr, perr := c.br.Peek(9)
	if perr != nil || http2.FrameType(hdr[3]) != http2.FrameData || http2.Flags(hdr[4])&http2.FlagDataPadded != 0 {
		return false, nil
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	id := binary.BigEndian.Uint32(hdr[5:9]) & (1<<31 - 1)
	end := http2.Flags(hdr[4])&http2.FlagDataEndStream != 0
	if id == 0 || n > maxFrameSize {
		return false, nil
	}
	// hdr is not read after this: the Peek may move the buffer's bytes.
	frame, perr := c.br.Peek(9 + n)
	if perr != nil {
		return false, nil
	}
	c.reads.Add(1)
	// The payload is valid until the Discard: nothing reads the
	// connection meanwhile.
	err = c.onData(id, frame[9:], int32(n), end)
	_, _ = c.br.Discard(9 + n)
	return true, err
}

// handleErr is handle's error path: a connection error says GOAWAY.
func (c *conn) handleErr(err error) error {
	var ce errConn
	if errors.As(err, &ce) {
		c.goAway(ce.code, ce.msg)
	}
	return err
}

func (c *conn) handle(f http2.Frame) error {
	var err error
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		err = c.onHeaders(f)
	case *http2.DataFrame:
		err = c.onData(f.StreamID, f.Data(), int32(f.Length), f.StreamEnded())
	case *http2.SettingsFrame:
		err = c.onSettings(f)
	case *http2.PingFrame:
		err = c.onPing(f)
	case *http2.WindowUpdateFrame:
		err = c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		st := c.streams[f.StreamID]
		idle := c.idle(f.StreamID)
		c.mu.Unlock()
		if idle {
			// RFC 9113 §6.4: RST_STREAM on an idle stream is a connection
			// PROTOCOL_ERROR (h2spec http2/5.1/2, 6.4/2).
			return c.handleErr(errConn{http2.ErrCodeProtocol, fmt.Sprintf("RST_STREAM on idle stream %d", f.StreamID)})
		}
		if st != nil {
			st.abort(status.Error(codes.Canceled, "the client reset the stream"), false, 0)
		}
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.maxID = min(c.maxID, c.lastID)
		n := len(c.streams)
		c.mu.Unlock()
		if n == 0 {
			// Nothing open: the peer is done with the connection. What it
			// sent after its GOAWAY (a PING, h2spec http2/7/1) is still
			// answered for a moment; then the read ends the connection.
			// Before, it ended at once, and a PING that followed was met by
			// a closed socket (or a reset) on a loaded machine.
			_ = c.nc.SetReadDeadline(time.Now().Add(peerAwayGrace))
		}
	case *http2.PushPromiseFrame:
		err = errConn{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	default: // PRIORITY and unknown frames are ignored (RFC 9113 §5.5)
	}
	if err != nil {
		// Only here: ce escapes to errors.As, an allocation a frame.
		return c.handleErr(err)
	}
	return nil
}

// idle reports whether id names a stream that was never opened: a
// client's id above the last one opened, or a server's (even) one, which
// this server never opens. c.mu is held.
func (c *conn) idle(id uint32) bool {
	return id != 0 && (id%2 == 0 || id > c.lastID)
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			// The code the RFC gives (an initial window over 2^31-1 is a
			// FLOW_CONTROL_ERROR, RFC 9113 §6.5.2), not PROTOCOL_ERROR for
			// all.
			code := http2.ErrCodeProtocol
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				code = http2.ErrCode(ce)
			}
			return errConn{code, err.Error()}
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			c.mu.Lock()
			delta := int64(s.Val) - int64(c.peerWindow)
			c.peerWindow = int32(s.Val)
			for _, st := range c.streams {
				st.sendWindow += delta
				if st.sendWindow > 1<<31-1 {
					// RFC 9113 §6.9.2: a change that takes a stream's
					// window past 2^31-1 is a connection FLOW_CONTROL_ERROR.
					c.mu.Unlock()
					return errConn{http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE takes a stream's window above 2^31-1"}
				}
			}
			c.cond.Broadcast()
			c.mu.Unlock()
		case http2.SettingMaxFrameSize:
			c.mu.Lock()
			c.peerMaxFrame = s.Val
			c.mu.Unlock()
		case http2.SettingHeaderTableSize:
			c.wmu.Lock()
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
			c.wmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.write(c.fr.WriteSettingsAck)
}

func (c *conn) onPing(f *http2.PingFrame) error {
	if f.IsAck() {
		switch string(f.Data[:]) {
		case drainPingData:
			c.mu.Lock()
			c.maxID = c.lastID
			last, n := c.lastID, len(c.streams)
			c.mu.Unlock()
			if err := c.write(func() error { return c.fr.WriteGoAway(last, http2.ErrCodeNo, nil) }); err != nil {
				return err
			}
			if n == 0 {
				return io.EOF
			}
		}
		return nil
	}
	// grpc-go's enforcement (http2_server.go handlePing, with
	// PermitWithoutStream): a ping sooner than PingMinTime after the last
	// one is a strike, streams open or not, unless the server sent
	// headers or data since the last ping (an answer a client's
	// bandwidth probe may ping after). Before, a ping with a stream open
	// was never a strike: 2.11 M pings in 8 s took 150 % CPU.
	now := time.Now()
	c.mu.Lock()
	switch {
	case c.sentSincePing.Swap(false):
		c.pingStrikes = 0
	case now.Sub(c.lastPing) < c.srv.opts.PingMinTime:
		c.pingStrikes++
	}
	c.lastPing = now
	strikes := c.pingStrikes
	c.mu.Unlock()
	if strikes > 2 {
		return errConn{http2.ErrCodeEnhanceYourCalm, "too_many_pings"}
	}
	return c.write(func() error { return c.fr.WritePing(true, f.Data) })
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		c.connSend += int64(f.Increment)
		if c.connSend > 1<<31-1 {
			return errConn{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
		}
		c.cond.Broadcast()
		return nil
	}
	if c.idle(f.StreamID) {
		// RFC 9113 §5.1: WINDOW_UPDATE on an idle stream is a connection
		// PROTOCOL_ERROR (h2spec http2/5.1/3).
		return errConn{http2.ErrCodeProtocol, fmt.Sprintf("WINDOW_UPDATE on idle stream %d", f.StreamID)}
	}
	if st := c.streams[f.StreamID]; st != nil {
		st.sendWindow += int64(f.Increment)
		if st.sendWindow > 1<<31-1 {
			c.mu.Unlock()
			c.resetStream(f.StreamID, http2.ErrCodeFlowControl, status.Error(codes.Internal, "stream window above 2^31-1"))
			c.mu.Lock()
			return nil
		}
		c.cond.Broadcast()
	}
	return nil
}

// onData queues a DATA frame's messages on its stream. The connection's
// window is returned as data arrives (the streams' windows bound it);
// a stream's, as its handler takes the messages (stream.take).
func (c *conn) onData(id uint32, data []byte, n int32, end bool) error {
	if n > 0 {
		c.connUnacked += n
		if c.connUnacked >= c.srv.opts.ConnWindow/4 {
			inc := c.connUnacked
			c.connUnacked = 0
			if err := c.write(func() error { return c.fr.WriteWindowUpdate(0, uint32(inc)) }); err != nil {
				return err
			}
		}
	}
	c.mu.Lock()
	st := c.streams[id]
	c.mu.Unlock()
	if st == nil {
		if id > c.lastID {
			return errConn{http2.ErrCodeProtocol, "DATA on an idle stream"}
		}
		return nil // a stream that ended: its data is dropped
	}
	return st.onData(data, n, end)
}

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

// be32 reads a gRPC message prefix's length.
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
