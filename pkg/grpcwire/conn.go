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

// peerAwayGrace is how long a connection whose peer sent GOAWAY with
// nothing open is still read.
const peerAwayGrace = 500 * time.Millisecond

// readLoop reads frames until the connection fails or ends.
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

// be32 reads a gRPC message prefix's length.
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
