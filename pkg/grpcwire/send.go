package grpcwire

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func (st *stream) SendMsg(m any) error {
	st.smu.Lock()
	defer st.smu.Unlock()
	b, err := st.marshal(m)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	b[0] = 0
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	if !st.headerSent {
		// Buffered, not flushed: the message follows at once, and the two
		// go out in one write (a flush each was a system call more per
		// stream).
		if err := st.writeHeader(false); err != nil {
			return err
		}
	}
	err = st.writeData(b)
	if cap(st.wbuf) > 64<<10 {
		st.wbuf = nil
	}
	return err
}

// marshal returns m's encoding after 5 bytes of room for its prefix, in
// the stream's reused buffer.
func (st *stream) marshal(m any) ([]byte, error) {
	if bc := st.c.srv.bytesCodec; bc != nil {
		if cap(st.wbuf) < 5 {
			st.wbuf = make([]byte, 5, 512)
		}
		b, err := bc.AppendMarshal(st.wbuf[:5], m)
		if err == nil {
			st.wbuf = b
		}
		return b, err
	}
	data, err := st.c.srv.opts.Codec.Marshal(m)
	if err != nil {
		return nil, err
	}
	n := data.Len()
	if cap(st.wbuf) < 5+n {
		st.wbuf = make([]byte, 5+n)
	}
	b := st.wbuf[:5+n]
	data.CopyTo(b[5:])
	data.Free()
	return b, nil
}

func (st *stream) sendHeader() error { return st.writeHeader(true) }

// writeHeader writes the response headers, flushed or left for the next
// flush. st.smu is held.
func (st *stream) writeHeader(flush bool) error {
	if st.headerSent {
		return status.Error(codes.Internal, "grpc: headers already sent")
	}
	st.headerSent = true
	return st.c.writeFlush(func() error {
		if st.isReset() { // ended meanwhile: its trailers went out, or a reset
			return nil
		}
		return st.c.writeHeaderFrame(st.id, false, st.responseHeaders())
	}, flush)
}

func (st *stream) responseHeaders() []hpack.HeaderField {
	hs := make([]hpack.HeaderField, 0, 2+len(st.header))
	hs = append(hs, hpack.HeaderField{Name: ":status", Value: "200"}, hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	return appendMetadata(hs, st.header)
}

// writeData writes b in DATA frames as the peer's windows allow; the last
// is left buffered (conn.writeLater).
func (st *stream) writeData(b []byte) error {
	c := st.c
	for len(b) > 0 {
		c.mu.Lock()
		for (c.connSend <= 0 || st.sendWindow <= 0) && !c.closed && !st.isReset() {
			// A deadline (grpc-timeout) ends the wait as it ends a
			// receive's (the stream's context.AfterFunc broadcasts): before,
			// a peer that gave no window held the handler past it.
			if err := st.ctx.Err(); err != nil {
				c.mu.Unlock()
				return status.FromContextError(err).Err()
			}
			c.cond.Wait()
		}
		if c.closed || st.isReset() {
			c.mu.Unlock()
			if err := st.ctx.Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return status.Error(codes.Unavailable, "the stream or connection ended")
		}
		n := int64(len(b))
		n = min(n, c.connSend, st.sendWindow, int64(c.peerMaxFrame))
		c.connSend -= n
		st.sendWindow -= n
		c.mu.Unlock()
		chunk := b[:n]
		b = b[n:]
		w := c.write
		if len(b) == 0 {
			w = c.writeLater
		}
		skipped := false
		if err := w(func() error {
			// Checked with the writing side held: a reset (abort, finish)
			// marks the stream before it writes RST_STREAM, so no DATA
			// follows one.
			if st.isReset() {
				skipped = true
				return nil
			}
			c.sentSincePing.Store(true)
			return c.fr.WriteData(st.id, false, chunk)
		}); err != nil {
			return status.Error(codes.Unavailable, err.Error())
		}
		if skipped {
			return status.Error(codes.Canceled, "the stream was reset")
		}
	}
	return nil
}

// finish sends the handler's status as trailers, unless the stream was
// reset; and resets the stream if the peer has not ended its side (its
// remaining messages are not wanted), as grpc-go does.
func (st *stream) finish(err error) {
	st.mu.Lock()
	reset, half := st.reset, st.halfDone
	st.reset = true // nothing else is written
	st.mu.Unlock()
	// A send still waiting for window (on a goroutine the handler left
	// behind) wakes, sees the stream ended and gives up its smu.
	st.c.mu.Lock()
	st.c.cond.Broadcast()
	st.c.mu.Unlock()
	if reset {
		return
	}
	st.smu.Lock()
	defer st.smu.Unlock()
	s := status.Convert(err)
	// Left for the next flush (conn.writeLater): nothing waits for a
	// stream's end as it waits for a reply, and the trailers share a write
	// with whatever goes out next (a system call each before).
	_ = st.c.writeLater(func() error {
		if err := st.c.writeTrailers(st, s); err != nil {
			return err
		}
		if !half {
			return st.c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		return nil
	})
}

// writeTrailers writes the status (trailers-only if no header was sent).
// c.wmu is held.
func (c *conn) writeTrailers(st *stream, s *status.Status) error {
	var hs []hpack.HeaderField
	if !st.headerSent {
		st.headerSent = true
		hs = st.responseHeaders()
	}
	hs = appendStatus(hs, s)
	hs = appendMetadata(hs, st.trailer)
	return c.writeHeaderFrame(st.id, true, hs)
}

// answer writes writeStatusOnly's answer to a stream that is not opened.
func (c *conn) answer(id uint32, httpStatus int, s *status.Status) error {
	return c.write(func() error { return c.writeStatusOnly(id, httpStatus, s) })
}

// writeStatusOnly answers a stream that is not opened: an HTTP status,
// and a gRPC one if s is set. c.wmu is held.
func (c *conn) writeStatusOnly(id uint32, httpStatus int, s *status.Status) error {
	hs := []hpack.HeaderField{{Name: ":status", Value: fmt.Sprint(httpStatus)}}
	if s != nil {
		hs = append(hs, hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		hs = appendStatus(hs, s)
	}
	return c.writeHeaderFrame(id, true, hs)
}

// writeHeaderFrame encodes hs and writes it as HEADERS and CONTINUATION
// frames. c.wmu is held.
func (c *conn) writeHeaderFrame(id uint32, end bool, hs []hpack.HeaderField) error {
	c.sentSincePing.Store(true)
	c.hbuf.Reset()
	for _, h := range hs {
		if err := c.henc.WriteField(h); err != nil {
			return err
		}
	}
	block := c.hbuf.Bytes()
	c.mu.Lock()
	frame := int(c.peerMaxFrame)
	c.mu.Unlock()
	first := block
	if len(first) > frame {
		first = first[:frame]
	}
	block = block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: end, EndHeaders: len(block) == 0}); err != nil {
		return err
	}
	for len(block) > 0 {
		next := block
		if len(next) > frame {
			next = next[:frame]
		}
		block = block[len(next):]
		if err := c.fr.WriteContinuation(id, len(block) == 0, next); err != nil {
			return err
		}
	}
	return nil
}
