package grpcwire

import (
	"context"
	"fmt"
	"io"
	"strings"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// maxMetadataBytes bounds the metadata one stream keeps (names and values).
const maxMetadataBytes = 16 << 10

// onHeaders opens a stream, or ends the peer's side of one (trailers).
func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		c.mu.Unlock()
		if !f.StreamEnded() {
			c.resetStream(id, http2.ErrCodeProtocol, status.Error(codes.Internal, "trailers without END_STREAM"))
			return nil
		}
		st.mu.Lock()
		st.halfDone = true
		if st.recvErr == nil {
			st.recvErr = io.EOF
		}
		st.mu.Unlock()
		st.wake()
		return nil
	}
	if id%2 == 0 || id <= c.lastID {
		c.mu.Unlock()
		return errConn{http2.ErrCodeProtocol, fmt.Sprintf("HEADERS on stream %d (last %d)", id, c.lastID)}
	}
	c.lastID = id
	refused := id > c.maxID || c.closed || uint32(len(c.streams)) >= c.srv.opts.MaxConcurrentStreams
	c.mu.Unlock()
	if refused {
		return c.write(func() error { return c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
	}
	if f.Truncated {
		return c.answer(id, 431, nil)
	}
	var path, method, ctype, timeout string
	var md metadata.MD
	mdBytes := 0
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":path":
			path = hf.Value
		case ":method":
			method = hf.Value
		case "content-type":
			ctype = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			if hf.Value != "identity" {
				return c.answer(id, 200, status.New(codes.Unimplemented, "grpc: compression is not supported"))
			}
		case "te", "grpc-accept-encoding", "grpc-message-type", "grpc-status", "grpc-message", "grpc-status-details-bin":
		default:
			if len(hf.Name) > 0 && hf.Name[0] == ':' {
				continue
			}
			if strings.HasSuffix(hf.Name, "-bin") {
				// Binary metadata: nothing fusebox serves reads it, and each
				// reference to one HPACK table entry decoded and kept for
				// the stream's life amplified a small header block about
				// 2,000 times (#50: 200 streams, 256 MB). Not decoded.
				continue
			}
			if mdBytes += len(hf.Name) + len(hf.Value); mdBytes > maxMetadataBytes {
				// What a stream keeps of its metadata is bounded too (the
				// same amplification with text values); the rest is
				// dropped: fusebox reads one short key (its role).
				continue
			}
			if md == nil {
				md = metadata.MD{}
			}
			v, err := decodeMetadataValue(hf.Name, hf.Value)
			if err != nil {
				return c.answer(id, 200, status.New(codes.Internal, err.Error()))
			}
			md[hf.Name] = append(md[hf.Name], v)
		}
	}
	if method != "POST" {
		return c.answer(id, 415, nil)
	}
	if !isGRPCContentType(ctype) {
		// As grpc-go answers it: the HTTP status, and a gRPC one that says
		// why (the differential test).
		return c.answer(id, 415, status.Newf(codes.InvalidArgument, "invalid gRPC request content-type %q", ctype))
	}
	m := c.srv.methods[path]
	if m == nil {
		return c.answer(id, 200, status.Newf(codes.Unimplemented, "unknown method %s", path))
	}
	ctx := c.ctx
	var cancel context.CancelFunc
	if timeout != "" {
		d, err := parseTimeout(timeout)
		if err != nil {
			// 400 as grpc-go answers a malformed request header.
			return c.answer(id, 400, status.New(codes.Internal, err.Error()))
		}
		ctx, cancel = context.WithTimeout(ctx, d)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	if md != nil {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	st := &stream{c: c, id: id, cancel: cancel, method: path, signal: make(chan struct{}, 1), maxRecv: c.srv.opts.MaxRecvMsgSize}
	if m, ok := c.srv.opts.MaxRecvMsgSizeFor[path]; ok && m > 0 {
		st.maxRecv = min(m, st.maxRecv)
	}
	st.ctx = context.WithValue(ctx, streamKey{}, st) // EndFunc
	if timeout != "" {
		// The deadline wakes a receive that waits (take waits on the
		// stream's signal alone), and a send that waits for window.
		context.AfterFunc(ctx, func() {
			st.wake()
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
	}
	if f.StreamEnded() {
		st.halfDone, st.recvErr = true, io.EOF
	}
	if h := openingHook; h != nil {
		h(c)
	}
	c.mu.Lock()
	if c.closed {
		// The connection closed while the stream was read (Stop, from
		// another goroutine): its close aborted the streams it knew, and
		// a handler started now would wait for a wake nobody sends, and
		// hold Stop, which waits for the handlers (TestStress under load:
		// the poison step hung for its ten minutes).
		c.mu.Unlock()
		cancel()
		return nil
	}
	st.sendWindow = int64(c.peerWindow)
	c.streams[id] = st
	c.mu.Unlock()
	c.srv.handlers.Add(1)
	Go(func() { // a reused goroutine (Workers)
		defer c.srv.handlers.Done()
		st.run(m)
	})
	c.woke = true
	return nil
}

// openingHook, when a test sets it, runs between a stream's admission and
// its entry in the connection's table: where another goroutine can close
// the connection.
var openingHook func(*conn)

func isGRPCContentType(ct string) bool {
	const p = "application/grpc"
	return len(ct) >= len(p) && ct[:len(p)] == p && (len(ct) == len(p) || ct[len(p)] == '+' || ct[len(p)] == ';')
}
