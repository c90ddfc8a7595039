package grpcwire

import (
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// handle acts on one frame the peer sent; frames.go holds the
// connection-level ones, open.go, recv.go and send.go a stream's.
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
