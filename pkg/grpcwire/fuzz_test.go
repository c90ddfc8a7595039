package grpcwire

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/encoding"
)

// framesOf encodes a client's frames after the preface, for the seeds.
func framesOf(write func(fr *http2.Framer, enc func(kv ...string) []byte)) []byte {
	var b, hb bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	he := hpack.NewEncoder(&hb)
	enc := func(kv ...string) []byte {
		hb.Reset()
		for i := 0; i+1 < len(kv); i += 2 {
			_ = he.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		return append([]byte(nil), hb.Bytes()...)
	}
	write(fr, enc)
	return b.Bytes()
}

// FuzzConnFrames feeds a connection arbitrary bytes after the client
// preface: it must neither panic nor hang, and it ends once the peer
// goes away.
func FuzzConnFrames(f *testing.F) {
	f.Add(framesOf(func(fr *http2.Framer, enc func(kv ...string) []byte) {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc(envoyHeaders(processPath, "x-fusebox-role", "route")...), EndHeaders: true})
		_ = fr.WriteData(1, false, msg(&extprocv3.ProcessingRequest{}))
		_ = fr.WriteData(1, true, msg(&extprocv3.ProcessingRequest{}))
		_ = fr.WritePing(false, [8]byte{1})
	}))
	f.Add(framesOf(func(fr *http2.Framer, enc func(kv ...string) []byte) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc(envoyHeaders(processPath)...)[:3], EndHeaders: false})
		_ = fr.WriteContinuation(1, true, enc(envoyHeaders(processPath)...)[3:])
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
		_ = fr.WriteWindowUpdate(0, 1<<30)
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	}))
	f.Add(framesOf(func(fr *http2.Framer, enc func(kv ...string) []byte) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: enc(envoyHeaders("/grpc.health.v1.Health/Check", "grpc-timeout", "1S")...), EndHeaders: true})
		_ = fr.WriteData(3, true, []byte{0, 0, 0, 0, 0})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: enc(envoyHeaders(processPath)...), EndHeaders: true})
		_ = fr.WriteData(5, false, []byte{0, 0xff, 0xff, 0xff, 0xff})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 7, BlockFragment: enc(envoyHeaders(processPath)...), EndHeaders: true, EndStream: true})
	}))
	s := NewServer(Options{Codec: encoding.GetCodecV2("proto"), MaxRecvMsgSize: 64 << 10, PingMinTime: time.Hour})
	extprocv3.RegisterExternalProcessorServer(s, proc{fn: echo})
	f.Fuzz(func(t *testing.T, in []byte) {
		server, client := net.Pipe()
		c := newConn(s, server)
		s.connWG.Add(1)
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = client.Write([]byte(http2.ClientPreface))
		_, _ = client.Write(in)
		client.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the connection did not end after its peer went away")
		}
	})
}
