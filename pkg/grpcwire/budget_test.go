package grpcwire

import (
	"encoding/binary"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// prefix is a message's 5-byte gRPC prefix announcing size bytes.
func prefix(size int) []byte { return binary.BigEndian.AppendUint32([]byte{0}, uint32(size)) }

// #50: what unfinished messages hold is bounded across streams, checked on
// each message's length prefix before a byte of it is buffered. Two
// streams announce 20 MiB messages and send a few bytes of each: with a
// 32 MiB budget the first is buffered, the second's receive fails with
// ResourceExhausted at once, and a stream with small messages is served.
// Before, nothing bounded it (eight unfinished 32 MiB messages: 802 MB,
// and the legitimate client's p99 at 668 ms).
func TestUnfinishedMessagesHaveABudget(t *testing.T) {
	errs := make(chan error, 3)
	ts := serve(t, Options{MaxRecvMsgSize: 32 << 20, MaxBufferedBytes: 32 << 20}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		for {
			if _, err := s.Recv(); err != nil {
				errs <- err
				return err
			}
			if err := s.Send(&extprocv3.ProcessingResponse{}); err != nil {
				return err
			}
		}
	})
	r := dialRaw(t, ts.addr)
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{1, 3} {
		r.headers(id, false, envoyHeaders(processPath)...)
		r.data(id, false, append(prefix(20<<20), make([]byte, 1000)...))
	}
	err := <-errs
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the stream past the budget: %v", err)
	}
	if b := ts.Server.buffered.Load(); b != 5+20<<20 {
		t.Fatalf("%d bytes charged, want the first message's", b)
	}
	r.headers(5, false, envoyHeaders(processPath)...)
	r.data(5, false, msg(&extprocv3.ProcessingRequest{}))
	r.next(func(f http2.Frame) bool { d, ok := f.(*http2.DataFrame); return ok && d.StreamID == 5 })
	// The first stream's end gives its charge back.
	_ = r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	<-errs
	eventually(t, "the charge given back", func() bool { return ts.Server.buffered.Load() == 0 })
}

// #50: a method's own bound is checked on the length prefix: an access log
// message over its 1 MiB is refused before it is buffered (before, the
// transport buffered the whole message, up to limits.max_message_bytes,
// and the codec refused it after).
func TestAMethodsBoundIsCheckedOnThePrefix(t *testing.T) {
	errs := make(chan error, 1)
	ts := serve(t, Options{MaxRecvMsgSize: 32 << 20, MaxRecvMsgSizeFor: map[string]int{processPath: 1 << 20}},
		func(s extprocv3.ExternalProcessor_ProcessServer) error {
			_, err := s.Recv()
			errs <- err
			return err
		})
	r := dialRaw(t, ts.addr)
	r.headers(1, false, envoyHeaders(processPath)...)
	r.data(1, false, append(prefix(2<<20), make([]byte, 100)...))
	if err := <-errs; status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v", err)
	}
	if b := ts.Server.buffered.Load(); b != 0 {
		t.Fatalf("%d bytes charged for a refused message", b)
	}
}

// eventually polls cond for up to 5 s (what it waits for happens on the
// server's goroutines).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
