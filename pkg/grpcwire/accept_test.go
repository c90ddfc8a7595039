package grpcwire

import (
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// failingListener fails its first n accepts with err, then accepts.
type failingListener struct {
	net.Listener
	n   atomic.Int32
	err error
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// #50 (HIGH): an accept error that is not the listener's close backs off
// and accepts again; it never ends Serve (and with it the process).
// Before, only a timeout was retried: EMFILE, ENFILE or ENOBUFS returned
// from Serve and fusebox exited 1 (20,232 idle connections, the default
// descriptor limit, killed it in 13 s).
func TestAcceptErrorsBackOff(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &failingListener{Listener: inner, err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}}
			ln.n.Store(4)
			var heard atomic.Int32
			s := NewServer(Options{Codec: encodingProto(), OnAcceptError: func(error) { heard.Add(1) }})
			extprocv3.RegisterExternalProcessorServer(s, proc{fn: echo})
			done := make(chan error, 1)
			go func() { done <- s.Serve(ln) }()
			t.Cleanup(s.Stop)
			cc, err := grpc.NewClient(inner.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ps, err := extprocv3.NewExternalProcessorClient(cc).Process(ctxT(t))
			if err == nil {
				err = ps.Send(&extprocv3.ProcessingRequest{})
			}
			if err == nil {
				_, err = ps.Recv()
			}
			select {
			case serr := <-done:
				t.Fatalf("Serve returned %v on an accept error", serr)
			default:
			}
			if err != nil {
				t.Fatalf("no call served after the accept errors: %v", err)
			}
			if heard.Load() != 4 {
				t.Fatalf("%d accept errors heard, want 4", heard.Load())
			}
			s.Stop()
			if serr := <-done; serr != nil {
				t.Fatalf("Serve after Stop: %v", serr)
			}
		})
	}
}
