package grpcwire

import (
	"bytes"
	"context"
	"flag"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

var stressFor = flag.Duration("stress.for", 3*time.Second, "how long TestStress drives the transport before it drains it")

// TestStress (#50) mixes, on one server with small windows and a low
// stream limit, for -stress.for (run under -race by make test):
//   - grpc-go clients whose streams carry large and small messages, some
//     with a deadline (grpc-timeout), some cancelled (RST_STREAM) midway;
//   - handlers that echo, reply large (waiting on the peer's window), end
//     their stream from another goroutine (EndFunc), fail, or take their
//     messages inline;
//   - raw peers that change SETTINGS_INITIAL_WINDOW_SIZE mid-stream, reset
//     streams, ping, withhold window updates, and end with a GOAWAY of
//     their own;
//   - then the server's drain (GOAWAY, GracefulStop) with streams open.
//
// It holds that nothing races or panics, the drain ends once the streams
// do (Stop after a bound), every handler returns, the buffer budget comes
// back to zero and no goroutine is left. The seed is printed.
func TestStress(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var handlers, handled, opened atomic.Int64
	big := bytes.Repeat([]byte("b"), 200<<10)
	ts := serve(t, Options{StreamWindow: 64 << 10, ConnWindow: 256 << 10, MaxConcurrentStreams: 32, WriteTimeout: 2 * time.Second},
		func(s extprocv3.ExternalProcessor_ProcessServer) error {
			handlers.Add(1)
			opened.Add(1)
			defer handlers.Add(-1)
			m, err := s.Recv()
			if err != nil {
				return err
			}
			kind := len(m.GetRequestBody().GetBody()) % 5
			switch kind {
			case 1: // ends from elsewhere, while the handler waits
				end := EndFunc(s.Context())
				go func() {
					time.Sleep(time.Duration(len(m.GetRequestBody().GetBody())%7) * time.Millisecond)
					end(status.Error(codes.Unavailable, "ended"))
				}()
			case 2: // one-way messages taken on the reader
				SetInline(s.Context(), func([]byte) bool { handled.Add(1); return true })
			}
			for i := 0; ; i++ {
				if kind == 3 && i == 3 {
					return status.Error(codes.Internal, "a handler's error")
				}
				reply := &extprocv3.ProcessingResponse{}
				if kind == 4 {
					// A large reply waits on the peer's window.
					reply.DynamicMetadata = nil
					reply.Response = &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: big}}
				}
				if err := s.Send(reply); err != nil {
					return err
				}
				if _, err := s.Recv(); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
				handled.Add(1)
			}
		})
	// Idle workers of the process's pool wait for work by design (at most
	// 256): they are not left behind.
	live := func() int { return runtime.NumGoroutine() - int(pool.idle.Load()) }
	before := live()
	ctx, stop := context.WithTimeout(context.Background(), *stressFor)
	defer stop()
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			cc, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Error(err)
				return
			}
			defer cc.Close()
			client := extprocv3.NewExternalProcessorClient(cc)
			for ctx.Err() == nil {
				sctx, cancel := context.WithCancel(ctx)
				if rng.IntN(3) == 0 {
					sctx, cancel = context.WithTimeout(ctx, time.Duration(1+rng.IntN(20))*time.Millisecond)
				}
				stressStream(sctx, client, rng)
				cancel()
			}
		}()
	}
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(100+w)))
			for ctx.Err() == nil {
				rawStress(ctx, t, ts.addr, rng)
			}
		}()
	}
	// Drain midway through the load's last stretch: streams are open.
	<-ctx.Done()
	drained := make(chan struct{})
	go func() { ts.GracefulStop(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		// The peers still hold streams open: the bound is Stop.
		ts.Stop()
		<-drained
	}
	wg.Wait()
	eventually(t, "every handler returns", func() bool { return handlers.Load() == 0 })
	eventually(t, "the buffer budget is given back", func() bool { return ts.buffered.Load() == 0 })
	for deadline := time.Now().Add(5 * time.Second); live() > before; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left, %d before:\n%s", live(), before, buf[:runtime.Stack(buf, true)])
		}
	}
	if handled.Load() == 0 {
		t.Fatal("no message was handled: the load never reached the handlers")
	}
	t.Logf("%d streams, %d later messages handled", opened.Load(), handled.Load())
}

// stressStream is one grpc-go stream: a few messages, small or large,
// then a half-close, a cancel, or a deadline that runs out.
func stressStream(ctx context.Context, client extprocv3.ExternalProcessorClient, rng *rand.Rand) {
	s, err := client.Process(ctx)
	if err != nil {
		return
	}
	n := 1 + rng.IntN(6)
	for i := range n {
		size := rng.IntN(64)
		if rng.IntN(8) == 0 {
			size = 100<<10 + rng.IntN(100<<10)
		}
		if i == 0 {
			size = size - size%5 + rng.IntN(5) // the handler's kind
		}
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, size)}}}); err != nil {
			return
		}
		if rng.IntN(2) == 0 {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}
	if rng.IntN(4) == 0 {
		return // the caller cancels: RST_STREAM
	}
	_ = s.CloseSend()
	for {
		if _, err := s.Recv(); err != nil {
			return
		}
	}
}

// rawStress is one raw connection: streams opened and fed, the initial
// window changed under them, resets, pings, a window withheld, and the
// peer's own GOAWAY at the end.
func rawStress(ctx context.Context, t *testing.T, addr string, rng *rand.Rand) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return // the server is draining or stopped
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var wmu sync.Mutex
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hbuf bytes.Buffer
	henc := hpack.NewEncoder(&hbuf)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return
	}
	_ = fr.WriteSettings()
	// The reader acks SETTINGS and, unless withheld, returns window.
	withhold := rng.IntN(3) == 0
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			wmu.Lock()
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.DataFrame:
				if !withhold && len(f.Data()) > 0 {
					_ = fr.WriteWindowUpdate(0, uint32(len(f.Data())))
					_ = fr.WriteWindowUpdate(f.StreamID, uint32(len(f.Data())))
				}
			}
			wmu.Unlock()
		}
	}()
	write := func(f func() error) bool {
		wmu.Lock()
		defer wmu.Unlock()
		return f() == nil
	}
	id := uint32(1)
	for range 1 + rng.IntN(8) {
		if ctx.Err() != nil {
			break
		}
		hbuf.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", processPath}, {":authority", "fusebox"},
			{"content-type", "application/grpc"}, {"te", "trailers"}} {
			_ = henc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		sid := id
		id += 2
		if !write(func() error {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: hbuf.Bytes(), EndHeaders: true})
		}) {
			return
		}
		m := msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, rng.IntN(40))}}})
		switch rng.IntN(6) {
		case 0: // the initial window changes under the open streams
			write(func() error {
				return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(rng.IntN(1 << 20))})
			})
		case 1: // reset before the message ends
			write(func() error { return fr.WriteData(sid, false, m[:len(m)/2]) })
			write(func() error { return fr.WriteRSTStream(sid, http2.ErrCodeCancel) })
			continue
		case 2:
			write(func() error { return fr.WritePing(false, [8]byte{byte(rng.IntN(256))}) })
		}
		write(func() error { return fr.WriteData(sid, rng.IntN(2) == 0, m) })
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	}
	if rng.IntN(2) == 0 {
		write(func() error { return fr.WriteGoAway(id, http2.ErrCodeNo, nil) })
	}
	time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
}
