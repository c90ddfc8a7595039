package grpcwire

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

func encodingProto() encoding.CodecV2 { return encoding.GetCodecV2("proto") }

// bytesProto is proto's codec with the BytesCodec methods, the path
// extproc.Codec takes.
type bytesProto struct{ encoding.CodecV2 }

func (bytesProto) UnmarshalBytes(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (bytesProto) AppendMarshal(dst []byte, v any) ([]byte, error) {
	return proto.MarshalOptions{}.MarshalAppend(dst, v.(proto.Message))
}

// proc is an ext_proc service whose Process is fn.
type proc struct {
	extprocv3.UnimplementedExternalProcessorServer
	fn func(extprocv3.ExternalProcessor_ProcessServer) error
}

func (p proc) Process(s extprocv3.ExternalProcessor_ProcessServer) error { return p.fn(s) }

// echo answers every message with a request-headers reply until EOF.
func echo(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}); err != nil {
			return err
		}
	}
}

type testServer struct {
	*Server
	addr   string
	health *health.Server
	done   chan error
}

// serve starts a Server with opts (Codec defaults to proto) and fn as
// ext_proc's Process, plus grpc.health.v1.
func serve(t testing.TB, opts Options, fn func(extprocv3.ExternalProcessor_ProcessServer) error) *testServer {
	t.Helper()
	if opts.Codec == nil {
		opts.Codec = encoding.GetCodecV2("proto")
	}
	s := NewServer(opts)
	extprocv3.RegisterExternalProcessorServer(s, proc{fn: fn})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, addr: ln.Addr().String(), health: hs, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ts
}

func (ts *testServer) client(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(ts.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// raw is a hand-driven HTTP/2 client, for what a gRPC client library
// never sends.
type raw struct {
	t    testing.TB
	c    net.Conn
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
}

func dialRaw(t testing.TB, addr string) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &raw{t: t, c: c}
	r.henc = hpack.NewEncoder(&r.hbuf)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	r.fr = http2.NewFramer(c, c)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := r.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return r
}

// envoyHeaders are the request headers Envoy's gRPC client sends on an
// ext_proc stream (docs/envoy.md, "The HTTP/2 an ext_proc stream is").
func envoyHeaders(path string, extra ...string) []string {
	h := []string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "fusebox",
		"content-type", "application/grpc", "te", "trailers"}
	return append(h, extra...)
}

const processPath = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"

func (r *raw) headers(id uint32, end bool, kv ...string) {
	r.t.Helper()
	r.hbuf.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		_ = r.henc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true, EndStream: end}); err != nil {
		r.t.Fatal(err)
	}
}

// msg is m as one gRPC length-prefixed message.
func msg(m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	out := make([]byte, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	copy(out[5:], b)
	return out
}

func (r *raw) data(id uint32, end bool, b []byte) {
	r.t.Helper()
	if err := r.fr.WriteData(id, end, b); err != nil {
		r.t.Fatal(err)
	}
}

// next reads frames until pred takes one, acking settings on the way;
// it fails the test after 5 s.
func (r *raw) next(pred func(http2.Frame) bool) http2.Frame {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("reading frames: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			_ = r.fr.WriteSettingsAck()
		}
		if pred(f) {
			return f
		}
	}
}

// grpcStatus waits for stream id's trailers and returns grpc-status.
func (r *raw) grpcStatus(id uint32) string {
	r.t.Helper()
	f := r.next(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == id && h.StreamEnded()
	}).(*http2.MetaHeadersFrame)
	return f.PseudoValue("status") + "/" + headerValue(f, "grpc-status")
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.Fields {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}
