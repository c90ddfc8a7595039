package grpcwire

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// An inline function gets the messages that arrive while its handler
// waits, on the reader, in order with those the handler receives, and
// never while the handler runs; a message it declines reaches Recv and
// the inlining goes on; a panic ends the inlining, not the stream.
func TestSetInline(t *testing.T) {
	if SetInline(context.Background(), func([]byte) bool { return true }) {
		t.Fatal("SetInline took a context that is no stream's")
	}
	var (
		mu      sync.Mutex
		order   []string // who handled each message: i (inline) or r (Recv), and its body
		running bool     // the handler is between two Recvs
	)
	body := func(b []byte) string {
		var m extprocv3.ProcessingRequest
		if err := proto.Unmarshal(b, &m); err != nil {
			t.Error(err)
		}
		return string(m.GetResponseBody().GetBody())
	}
	streams := make(chan *stream, 1)
	// The order is the test's question, not the budget's (TestInline-
	// JudgingHasABudget): under -race and the poison build on a loaded
	// machine one call took over the 500 µs bound, which ended the
	// inlining (r1..r9).
	ts := serve(t, Options{inlineSlowCall: time.Minute}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		SetInline(s.Context(), func(b []byte) bool {
			mu.Lock()
			defer mu.Unlock()
			if running {
				t.Error("the inline function ran while the handler did")
			}
			switch v := body(b); v {
			case "3": // declined
				return false
			case "7":
				panic("an inline function's panic")
			default:
				order = append(order, "i"+v)
				return true
			}
		})
		streams <- s.(*grpc.GenericServerStream[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]).ServerStream.(*stream)
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			mu.Lock()
			running = true
			order = append(order, "r"+string(m.GetResponseBody().GetBody()))
			running = false
			mu.Unlock()
		}
	})
	c, err := extprocv3.NewExternalProcessorClient(ts.client(t)).Process(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(&extprocv3.ProcessingRequest{}); err != nil { // opens the stream
		t.Fatal(err)
	}
	st := <-streams
	const n = 10
	for i := range n {
		// Each message once the one before is handled and the handler
		// waits again.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Microsecond) {
			mu.Lock()
			handled := len(order)
			mu.Unlock()
			st.mu.Lock()
			waiting := st.waiting
			st.mu.Unlock()
			if handled == i+1 && waiting {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("message %d: %d handled, the handler waiting %v", i, handled, waiting)
			}
		}
		if err := c.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: fmt.Appendf(nil, "%d", i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.CloseSend()
	if _, err := c.Recv(); err == nil {
		t.Fatal("a reply where none was sent")
	}
	mu.Lock()
	defer mu.Unlock()
	// The first (empty) message went either way: it may arrive before the
	// handler first waits.
	want := "i0 i1 i2 r3 i4 i5 i6 r7 r8 r9"
	if got := strings.Join(order[1:], " "); len(order) != n+1 || order[0][1:] != "" || got != want {
		t.Fatalf("handled %q, want %q", got, want)
	}
}

// The reader's budget for inline functions (#50): every stream of the
// connection waits while one runs, so a slow call ends its stream's
// inlining, the calls of one read share a budget, and a large message is
// never offered. Before, every one of these went inline: 20 slow calls
// stalled the reader 20 times over.
func TestInlineJudgingHasABudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sleep   time.Duration
		n, size int
		// most inline calls allowed, and whether the stream is handed off
		maxInline int
		handoff   bool
	}{
		{"a slow call hands the stream to its goroutine", 2 * time.Millisecond, 20, 10, 1, true},
		{"calls within one read share a budget", 300 * time.Microsecond, 20, 10, 4, false},
		{"a message over 16 KiB is never offered", 0, 1, 20 << 10, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var inlined, received atomic.Int64
			streams := make(chan *stream, 1)
			done := make(chan struct{})
			ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
				defer close(done)
				if _, err := s.Recv(); err != nil { // the opening message
					return err
				}
				SetInline(s.Context(), func([]byte) bool {
					inlined.Add(1)
					time.Sleep(tc.sleep)
					return true
				})
				streams <- s.(*grpc.GenericServerStream[extprocv3.ProcessingRequest, extprocv3.ProcessingResponse]).ServerStream.(*stream)
				for {
					if _, err := s.Recv(); err != nil {
						return nil
					}
					received.Add(1)
				}
			})
			r := dialRaw(t, ts.addr)
			r.headers(1, false, envoyHeaders(processPath)...)
			r.data(1, false, msg(&extprocv3.ProcessingRequest{}))
			var st *stream
			select {
			case st = <-streams:
			case <-time.After(10 * time.Second):
				t.Fatal("the stream never opened")
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Microsecond) {
				st.mu.Lock()
				w := st.waiting
				st.mu.Unlock()
				if w {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the handler never waited")
				}
			}
			// Every message in one write, so that the reader reads them at
			// once.
			var buf bytes.Buffer
			fr := http2.NewFramer(&buf, nil)
			chunk := msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: bytes.Repeat([]byte("x"), tc.size)}}})
			for i := range tc.n {
				for b := chunk; len(b) > 0; {
					k := min(len(b), 16384)
					_ = fr.WriteData(1, i == tc.n-1 && k == len(b), b[:k])
					b = b[k:]
				}
			}
			if _, err := r.c.Write(buf.Bytes()); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler never ended")
			}
			in, rc := inlined.Load(), received.Load()
			if in+rc != int64(tc.n) {
				t.Fatalf("%d inline + %d received of %d messages", in, rc, tc.n)
			}
			if in > int64(tc.maxInline) {
				t.Fatalf("%d calls on the reader, want at most %d", in, tc.maxInline)
			}
			if tc.handoff && ts.InlineHandoffs() != 1 {
				t.Fatalf("%d streams handed off, want 1", ts.InlineHandoffs())
			}
		})
	}
}
