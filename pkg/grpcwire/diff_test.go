package grpcwire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The differential test (#50): the same frame scripts, well-formed and
// malformed, go to grpcwire and to grpc-go's server, with the same
// handler; what the handler saw (metadata, deadline, messages, how its
// receive ended) and what came back on the wire (HTTP status, gRPC status
// and message, reply messages, stream resets, GOAWAY) must be the same.
// Flow control is compared by what it lets through: an upload of several
// windows that waits for the server's WINDOW_UPDATEs must reach the
// handler whole on both. Each intended difference is listed with its
// reason, and a listed difference that is gone fails the test (take it
// off the list).

// diffIntended: scripts whose outcomes differ on purpose, and why.
var diffIntended = map[string]string{
	"binary metadata":              "grpcwire never decodes -bin values (nothing fusebox serves reads them; an HPACK bomb of them amplified 2,000x): the handler sees no k-bin key",
	"RST_STREAM on an idle stream": "grpcwire ends the connection with PROTOCOL_ERROR as RFC 9113 §6.4 says (h2spec http2/5.1/2); grpc-go ignores the frame",
	"a compressed message with no grpc-encoding": "grpcwire refuses a compressed message as Unimplemented (it supports no compression, and says so); " +
		"grpc-go answers Internal, the message having claimed an encoding the stream never declared",
}

// diffView is what one stream's handler saw.
type diffView struct {
	role     string
	bin      bool
	deadline bool
	msgs     []string
	end      string
}

func (v diffView) String() string {
	return fmt.Sprintf("role=%q bin=%v deadline=%v msgs=%v end=%s", v.role, v.bin, v.deadline, summarize(v.msgs), v.end)
}

// summarize shortens long message lists (uploads) to a count and a digest,
// and long messages to their length.
func summarize(msgs []string) string {
	if len(msgs) <= 4 {
		short := make([]string, len(msgs))
		for i, m := range msgs {
			short[i] = m
			if len(m) > 16 {
				short[i] = fmt.Sprintf("%s…(%d bytes)", m[:8], len(m))
			}
		}
		return fmt.Sprint(short)
	}
	n := 0
	for _, m := range msgs {
		n += len(m)
	}
	return fmt.Sprintf("%d messages, %d bytes, first %q last %q", len(msgs), n, msgs[0][:min(8, len(msgs[0]))], msgs[len(msgs)-1][:min(8, len(msgs[len(msgs)-1]))])
}

type diffRecorder struct {
	mu     sync.Mutex
	views  []string
	active atomic.Int64
}

func (r *diffRecorder) handler(s extprocv3.ExternalProcessor_ProcessServer) error {
	r.active.Add(1)
	defer r.active.Add(-1)
	md, _ := metadata.FromIncomingContext(s.Context())
	_, dl := s.Context().Deadline()
	v := diffView{deadline: dl, bin: len(md.Get("k-bin")) > 0}
	if r := md.Get("x-fusebox-role"); len(r) > 0 {
		v.role = r[0]
	}
	defer func() {
		r.mu.Lock()
		r.views = append(r.views, v.String())
		r.mu.Unlock()
	}()
	for {
		m, err := s.Recv()
		if err != nil {
			v.end = "EOF"
			if err != io.EOF {
				v.end = status.Code(err).String()
			}
			return nil
		}
		b := string(m.GetRequestBody().GetBody())
		v.msgs = append(v.msgs, b)
		switch {
		case b == "fail":
			return status.Error(3, "the handler refused it")
		case b == "quiet":
			continue
		case strings.HasPrefix(b, "up"):
			continue // an upload: no replies
		}
		if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("r:" + b)}}}}}}); err != nil {
			v.end = "send: " + status.Code(err).String()
			return err
		}
	}
}

// diffClient plays a script over a raw connection and reads what the
// server answers.
type diffClient struct {
	t    *testing.T
	c    net.Conn
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// per stream: what came back
	wire   map[uint32]*diffWire
	goAway string
	closed bool
	// connWindow, streamWindow: what the server gave back so far on
	// stream 0 and per stream; initial: its SETTINGS_INITIAL_WINDOW_SIZE.
	connWindow   int64
	streamWindow map[uint32]int64
	initial      int64
}

type diffWire struct {
	status, ct, grpcStatus, grpcMessage string
	replies                             []string
	rst                                 string
	ended                               bool
	pending                             []byte
}

// String is what is compared. grpc-message is compared where the handler
// wrote it (its refusal, code 3); where the transport wrote it, the code
// is compared and the wording is each implementation's own.
func (w *diffWire) String() string {
	msg := w.grpcMessage
	if w.grpcStatus != "3" && msg != "" {
		msg = "(the transport's)"
	}
	return fmt.Sprintf("status=%s ct=%q grpc-status=%s grpc-message=%q replies=%v rst=%s", w.status, w.ct, w.grpcStatus, msg, summarize(w.replies), w.rst)
}

func dialDiff(t *testing.T, addr string) *diffClient {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	d := &diffClient{t: t, c: c, wire: map[uint32]*diffWire{}, streamWindow: map[uint32]int64{}, initial: 65535}
	d.henc = hpack.NewEncoder(&d.hbuf)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	d.fr = http2.NewFramer(c, c)
	d.fr.ReadMetaHeaders = hpack.NewDecoder(65536, nil)
	if err := d.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *diffClient) stream(id uint32) *diffWire {
	w, ok := d.wire[id]
	if !ok {
		w = &diffWire{}
		d.wire[id] = w
	}
	return w
}

// headers opens stream id with the gRPC request headers, the extra ones
// added and those named in drop left out.
func (d *diffClient) headers(id uint32, end bool, extra []string, drop ...string) {
	d.stream(id)
	d.hbuf.Reset()
	kv := append(envoyHeaders(processPath), extra...)
	for i := 0; i+1 < len(kv); i += 2 {
		if slices.Contains(drop, kv[i]) {
			continue
		}
		// A later value of a pseudo-header or content-type replaces the
		// default.
		if j := slices.Index(kv[i+2:], kv[i]); j >= 0 && j%2 == 0 && (strings.HasPrefix(kv[i], ":") || kv[i] == "content-type") {
			continue
		}
		_ = d.henc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	_ = d.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: d.hbuf.Bytes(), EndHeaders: true, EndStream: end})
}

func bodyMsg(b string) []byte {
	return msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b)}}})
}

// settle reads what the server sends in the next 50 ms.
func (d *diffClient) settle() {
	_ = d.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	d.readFor()
}

// data writes b on stream id in frames of at most 16 KiB.
func (d *diffClient) data(id uint32, end bool, b []byte) {
	for {
		k := min(len(b), 16384)
		_ = d.fr.WriteData(id, end && k == len(b), b[:k])
		if b = b[k:]; len(b) == 0 {
			return
		}
	}
}

// read takes frames until every stream the script opened has ended, the
// connection ends, or 2 s pass; until reports when to stop early (nil:
// never).
func (d *diffClient) read(until func() bool) {
	_ = d.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	d.readUntil(until)
}

func (d *diffClient) readFor() { d.readUntil(func() bool { return false }) }

func (d *diffClient) readUntil(until func() bool) {
	defer d.c.SetReadDeadline(time.Time{})
	for !d.closed {
		if until != nil && until() {
			return
		}
		if until == nil {
			done := true
			for _, w := range d.wire {
				done = done && (w.ended || w.rst != "")
			}
			if done {
				return
			}
		}
		f, err := d.fr.ReadFrame()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return
			}
			d.closed = true
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					d.initial = int64(v)
				}
				_ = d.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = d.fr.WritePing(true, f.Data)
			}
		case *http2.GoAwayFrame:
			d.goAway = f.ErrCode.String()
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				d.connWindow += int64(f.Increment)
			} else {
				d.streamWindow[f.StreamID] += int64(f.Increment)
			}
		case *http2.RSTStreamFrame:
			d.stream(f.StreamID).rst = f.ErrCode.String()
		case *http2.MetaHeadersFrame:
			w := d.stream(f.StreamID)
			if s := f.PseudoValue("status"); s != "" {
				w.status = s
			}
			for _, h := range f.RegularFields() {
				switch h.Name {
				case "content-type":
					w.ct = h.Value
				case "grpc-status":
					w.grpcStatus = h.Value
				case "grpc-message":
					w.grpcMessage = h.Value
				}
			}
			w.ended = w.ended || f.StreamEnded()
		case *http2.DataFrame:
			w := d.stream(f.StreamID)
			w.pending = append(w.pending, f.Data()...)
			for len(w.pending) >= 5 && len(w.pending) >= 5+int(binary.BigEndian.Uint32(w.pending[1:5])) {
				n := int(binary.BigEndian.Uint32(w.pending[1:5]))
				var m extprocv3.ProcessingResponse
				if err := proto.Unmarshal(w.pending[5:5+n], &m); err != nil {
					w.replies = append(w.replies, "undecodable")
				} else {
					w.replies = append(w.replies, string(m.GetRequestBody().GetResponse().GetBodyMutation().GetBody()))
				}
				w.pending = w.pending[5+n:]
			}
			if len(f.Data()) > 0 {
				// Give the window back at once: the client is not what is
				// tested.
				_ = d.fr.WriteWindowUpdate(0, uint32(len(f.Data())))
				_ = d.fr.WriteWindowUpdate(f.StreamID, uint32(len(f.Data())))
			}
			w.ended = w.ended || f.StreamEnded()
		}
	}
}

// upload sends total bytes on stream id in messages of one DATA frame,
// never past the connection's or the stream's window: it waits for the
// server's WINDOW_UPDATEs, so a server that never returns window stalls
// it.
func (d *diffClient) upload(id uint32, total int) {
	d.settle() // the server's SETTINGS
	sent := int64(0)
	payload := strings.Repeat("u", 8000)
	for i := 0; int(sent) < total; i++ {
		m := bodyMsg(fmt.Sprintf("up%05d", i) + payload)
		room := func() int64 { return min(65535+d.connWindow, d.initial+d.streamWindow[id]) - sent }
		for int64(len(m)) > room() {
			before := room()
			d.read(func() bool { return room() > before })
			if room() == before {
				return // stalled: the outcome shows the messages missing
			}
		}
		_ = d.fr.WriteData(id, false, m)
		sent += int64(len(m))
	}
	_ = d.fr.WriteData(id, true, nil)
}

type diffScript struct {
	name string
	play func(d *diffClient)
}

// diffWireOnly: scripts where what the handler sees races with the
// transport in both implementations, so only the wire is compared.
// (DATA after END_STREAM is not a script: whether the handler answers
// before the late frame is read is a race on both servers, on the wire as
// in the handler; h2spec's http2/5.1 cases hold that frame.)
var diffWireOnly = map[string]string{}

var diffScripts = []diffScript{
	{"one message and a half-close", func(d *diffClient) {
		d.headers(1, false, nil)
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"three messages in one frame, one split across two", func(d *diffClient) {
		d.headers(1, false, nil)
		all := append(append(bodyMsg("a"), bodyMsg("b")...), bodyMsg("c")...)
		d.fr.WriteData(1, false, all[:9])
		d.fr.WriteData(1, true, all[9:])
	}},
	{"the handler's error", func(d *diffClient) {
		d.headers(1, false, nil)
		d.fr.WriteData(1, false, bodyMsg("fail"))
	}},
	{"metadata and a timeout", func(d *diffClient) {
		d.headers(1, false, []string{"x-fusebox-role", "route", "grpc-timeout", "5S"})
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"binary metadata", func(d *diffClient) {
		d.headers(1, false, []string{"k-bin", "AQI"})
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"headers with END_STREAM: no message", func(d *diffClient) {
		d.headers(1, true, nil)
	}},
	{"two streams interleaved", func(d *diffClient) {
		d.headers(1, false, nil)
		d.headers(3, false, nil)
		d.fr.WriteData(3, false, bodyMsg("x"))
		d.fr.WriteData(1, false, bodyMsg("a"))
		d.fr.WriteData(1, true, bodyMsg("b"))
		d.fr.WriteData(3, true, bodyMsg("y"))
	}},
	{"an upload of several windows", func(d *diffClient) {
		d.headers(1, false, nil)
		d.upload(1, 300<<10)
	}},
	{"the client resets mid-message", func(d *diffClient) {
		d.headers(1, false, nil)
		d.fr.WriteData(1, false, bodyMsg("quiet"))
		d.settle() // let the handler take it
		m := bodyMsg("half")
		d.fr.WriteData(1, false, m[:6])
		d.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		d.stream(1).rst = "the client's CANCEL"
	}},
	{"a truncated message at END_STREAM", func(d *diffClient) {
		d.headers(1, false, nil)
		m := bodyMsg("whole")
		d.fr.WriteData(1, true, m[:len(m)-2])
	}},
	{"a message over the limit", func(d *diffClient) {
		d.headers(1, false, nil)
		d.data(1, true, bodyMsg(strings.Repeat("z", 20000)))
	}},
	{"a compressed message with no grpc-encoding", func(d *diffClient) {
		d.headers(1, false, nil)
		m := bodyMsg("a")
		m[0] = 1
		d.fr.WriteData(1, true, m)
	}},
	{"a GET", func(d *diffClient) {
		d.headers(1, false, []string{":method", "GET"})
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"an unknown method", func(d *diffClient) {
		d.headers(1, false, []string{":path", "/x.Y/Z"})
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"content-type not gRPC", func(d *diffClient) {
		d.headers(1, false, []string{"content-type", "text/plain"})
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"no te: trailers", func(d *diffClient) {
		d.headers(1, false, nil, "te")
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"a malformed grpc-timeout", func(d *diffClient) {
		d.headers(1, false, []string{"grpc-timeout", "soon"})
		d.fr.WriteData(1, true, bodyMsg("a"))
	}},
	{"an uppercase header name", func(d *diffClient) {
		d.headers(1, false, []string{"X-Upper", "v"})
		d.fr.WriteData(1, true, bodyMsg("a"))
		d.headers(3, false, nil)
		d.fr.WriteData(3, true, bodyMsg("b"))
	}},
	{"RST_STREAM on an idle stream", func(d *diffClient) {
		d.headers(1, false, nil)
		d.fr.WriteData(1, false, bodyMsg("a"))
		d.fr.WriteRSTStream(9, http2.ErrCodeCancel)
		d.fr.WriteData(1, true, bodyMsg("b"))
	}},
	{"a stream id going backwards", func(d *diffClient) {
		d.headers(5, false, nil)
		d.fr.WriteData(5, true, bodyMsg("a"))
		d.read(nil)
		d.headers(3, false, nil)
	}},
}

func TestDifferentialAgainstGRPCGo(t *testing.T) {
	const maxMsg = 12000 // over an upload's messages (8 KB), under the over-limit script's
	type server struct {
		name string
		addr string
		rec  *diffRecorder
	}
	wire := &diffRecorder{}
	ws := serve(t, Options{MaxRecvMsgSize: maxMsg}, wire.handler)
	gorec := &diffRecorder{}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(maxMsg))
	extprocv3.RegisterExternalProcessorServer(gs, proc{fn: gorec.handler})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	servers := []server{{"grpcwire", ws.addr, wire}, {"grpc-go", ln.Addr().String(), gorec}}

	for _, sc := range diffScripts {
		t.Run(sc.name, func(t *testing.T) {
			var outcomes [2]string
			for i, s := range servers {
				s.rec.mu.Lock()
				s.rec.views = nil
				s.rec.mu.Unlock()
				d := dialDiff(t, s.addr)
				sc.play(d)
				d.read(nil)
				for deadline := time.Now().Add(3 * time.Second); s.rec.active.Load() > 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				s.rec.mu.Lock()
				views := slices.Clone(s.rec.views)
				s.rec.mu.Unlock()
				slices.Sort(views)
				var b strings.Builder
				if _, wireOnly := diffWireOnly[sc.name]; !wireOnly {
					fmt.Fprintf(&b, "handlers: %v\n", views)
				}
				ids := make([]uint32, 0, len(d.wire))
				for id := range d.wire {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				for _, id := range ids {
					fmt.Fprintf(&b, "stream %d: %v\n", id, d.wire[id])
				}
				fmt.Fprintf(&b, "goaway: %q", d.goAway)
				outcomes[i] = b.String()
			}
			reason, intended := diffIntended[sc.name]
			switch {
			case intended && outcomes[0] == outcomes[1]:
				t.Fatalf("listed as an intended difference (%s), and the two now agree: take it off the list\n%s", reason, outcomes[0])
			case intended:
				t.Logf("intended difference: %s\ngrpcwire:\n%s\ngrpc-go:\n%s", reason, outcomes[0], outcomes[1])
			case os.Getenv("DIFF_SHOW") != "":
				t.Logf("grpcwire:\n%s\ngrpc-go:\n%s", outcomes[0], outcomes[1])
			case outcomes[0] != outcomes[1]:
				t.Fatalf("grpcwire and grpc-go differ\ngrpcwire:\n%s\ngrpc-go:\n%s", outcomes[0], outcomes[1])
			}
		})
	}
}
