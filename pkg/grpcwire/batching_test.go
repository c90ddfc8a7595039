package grpcwire

import (
	"bytes"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/encoding"
)

// countingListener hands out connections that count their writes: each
// is a system call, and on loopback the sender also pays for the peer's
// TCP receive path, so the transport's cost follows their number.
type countingListener struct {
	net.Listener
	last atomic.Pointer[countingConn]
}

type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: c}
	l.last.Store(cc)
	return cc, nil
}

// serveCounting is serve on a listener whose connections count writes.
func serveCounting(t *testing.T, fn func(extprocv3.ExternalProcessor_ProcessServer) error) (*countingListener, string) {
	t.Helper()
	s := NewServer(Options{Codec: encoding.GetCodecV2("proto")})
	extprocv3.RegisterExternalProcessorServer(s, proc{fn: fn})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	go func() { _ = s.Serve(cl) }()
	t.Cleanup(s.Stop)
	return cl, ln.Addr().String()
}

// The writes a stream's answer takes: its response headers and first
// message go out in one (a flush each before), and so do a last message
// and the trailers that follow it (deferred: nothing waits for a stream's
// end as for a reply). Each case fails with a flush per frame.
//
// One write needs the handler to reply before the 100 us flush timer
// fires; on a loaded machine it may be descheduled longer (CI, both cores
// busy: 2 writes). So each case takes up to 20 tries on fresh connections
// and must see one write in at least one: a transport that flushes each
// frame never does.
func TestAnAnswerIsOneWrite(t *testing.T) {
	body := msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}})
	for _, tc := range []struct {
		name string
		end  bool // the client ends its side with the message
		want func(t *testing.T, r *raw)
	}{
		{"the headers and the first reply", false, func(t *testing.T, r *raw) {
			r.next(func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
		}},
		{"the headers, the reply and the trailers", true, func(t *testing.T, r *raw) {
			if s := r.grpcStatus(1); s != "/0" {
				t.Fatalf("status %q", s)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []int64
			for range 20 {
				cl, addr := serveCounting(t, echo)
				r := dialRaw(t, addr)
				// The server's last handshake write is the ack of our
				// SETTINGS: once it is read, the server writes nothing
				// until the stream.
				r.next(func(f http2.Frame) bool { s, ok := f.(*http2.SettingsFrame); return ok && s.IsAck() })
				_ = r.fr.WriteSettingsAck()
				c := cl.last.Load()
				before := c.writes.Load()
				r.headers(1, false, envoyHeaders(processPath)...)
				r.data(1, tc.end, body)
				tc.want(t, r)
				n := c.writes.Load() - before
				if n == 1 {
					return
				}
				seen = append(seen, n)
			}
			t.Fatalf("writes per answer in 20 tries: %v, want 1 in at least one", seen)
		})
	}
}

// aliasProto is proto's codec as an AliasingCodec: the bytes of the last
// message it decoded are kept, to be checked while the handler holds it.
type aliasProto struct {
	bytesProto
	last  *[]byte
	never bool // reports no message aliased
}

func (a aliasProto) UnmarshalBytesAliased(b []byte, v any) (bool, error) {
	*a.last = b
	return !a.never, a.UnmarshalBytes(b, v)
}

// A message the codec did not alias gives its buffer back at once: a
// long-lived stream (Envoy's access log streams) holds nothing between
// messages. Held, each open access log stream kept its last batch's
// buffer, and the fleet soak's live heap grew past its 10 % under -race.
func TestAMessageNotAliasedIsNotHeld(t *testing.T) {
	var last []byte
	held := make(chan bool, 1)
	ts := serve(t, Options{Codec: aliasProto{bytesProto{encodingProto()}, &last, true}}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		st := s.(*grpc.GenericServerStream[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]).ServerStream.(*stream)
		held <- st.held != nil
		return nil
	})
	c, err := extprocv3.NewExternalProcessorClient(ts.client(t)).Process(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(&extprocv3.ProcessingRequest{}); err != nil {
		t.Fatal(err)
	}
	if <-held {
		t.Fatal("the stream holds the buffer of a message its codec did not alias")
	}
}

// A message decoded by an AliasingCodec may point into its buffer until
// the handler's next receive: the messages queued meanwhile, the same size
// as it, get other buffers.
func TestAnAliasedMessageKeepsItsBuffer(t *testing.T) {
	// One P: a buffer put back is the next one the reader gets (the
	// pool's private slot), so one put back too soon is overwritten.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var last []byte
	const more = 20
	result := make(chan error, 1)
	gotFirst := make(chan struct{}, 1)
	ts := serve(t, Options{Codec: aliasProto{bytesProto{encodingProto()}, &last, false}}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		first, want := last, string(last)
		gotFirst <- struct{}{}
		st := s.(*grpc.GenericServerStream[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]).ServerStream.(*stream)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			st.mu.Lock()
			queued := len(st.msgs) - st.head
			st.mu.Unlock()
			if queued == more {
				break
			}
			if time.Now().After(deadline) {
				result <- fmt.Errorf("%d of %d messages queued", queued, more)
				return nil
			}
		}
		if string(first) != want {
			result <- fmt.Errorf("the held message's bytes changed while it was held")
			return nil
		}
		for range more {
			if _, err := s.Recv(); err != nil {
				result <- err
				return nil
			}
		}
		result <- nil
		return nil
	})
	c, err := extprocv3.NewExternalProcessorClient(ts.client(t)).Process(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range more + 1 {
		if i == 1 {
			<-gotFirst // the rest arrive once the first is held
		}
		body := bytes.Repeat([]byte{byte('a' + i)}, 600)
		if err := c.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-result; err != nil {
		t.Fatal(err)
	}
}

// The flush timer is a backstop: replies flushed as their handler waits
// stop it, so in a conversation it never fires. Before, armed by every
// deferred write and never stopped, it fired after most replies: a
// goroutine and a write each (2.7% of the observer's CPU).
func TestTheFlushTimerIsABackstop(t *testing.T) {
	s := NewServer(Options{Codec: encodingProto()})
	extprocv3.RegisterExternalProcessorServer(s, proc{fn: echo})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	cc := (&testServer{addr: ln.Addr().String()}).client(t)
	c, err := extprocv3.NewExternalProcessorClient(cc).Process(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if err := c.Send(&extprocv3.ProcessingRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Microsecond) // past flushDelay: a timer still armed fires
	}
	var fired int64
	s.mu.Lock()
	for cn := range s.conns {
		fired += cn.timerFlushes.Load()
	}
	s.mu.Unlock()
	// A reply can race its handler's wait (the reader waits on the socket
	// while the handler has not yet come back to Recv): a few firings.
	if fired > 20 {
		t.Fatalf("the flush timer fired %d times in 200 exchanges", fired)
	}
}

// A DATA frame read in place (conn.readData) whose payload arrives after
// its header, in a later read that moves the buffered bytes: its flags
// are the frame's, not what the move left where its header was. With the
// header read after the move, the END_STREAM below was lost and the
// stream never ended.
func TestADataFrameSplitAcrossReads(t *testing.T) {
	ts := serve(t, Options{}, echo)
	r := dialRaw(t, ts.addr)
	r.next(func(f http2.Frame) bool { s, ok := f.(*http2.SettingsFrame); return ok && s.IsAck() })
	_ = r.fr.WriteSettingsAck()
	r.headers(1, false, envoyHeaders(processPath)...)
	// A short first frame, then a long one: after the move, where the
	// second one's header was there is its payload ('x': no END_STREAM).
	small := msg(&extprocv3.ProcessingRequest{})
	m := msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: bytes.Repeat([]byte("x"), 3000)}}})
	var frames bytes.Buffer
	fw := http2.NewFramer(&frames, nil)
	_ = fw.WriteData(1, false, small)
	_ = fw.WriteData(1, true, m)
	b := frames.Bytes()
	cut := len(b) - len(m)/2 // inside the second frame's payload
	if _, err := r.c.Write(b[:cut]); err != nil {
		t.Fatal(err)
	}
	// Time for the server to read the first part and wait for the rest:
	// its next read then moves the second frame's header.
	time.Sleep(50 * time.Millisecond)
	if _, err := r.c.Write(b[cut:]); err != nil {
		t.Fatal(err)
	}
	if s := r.grpcStatus(1); s != "200/0" && s != "/0" {
		t.Fatalf("status %q", s)
	}
}
