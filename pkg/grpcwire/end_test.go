package grpcwire

import (
	"context"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EndFunc ends a stream whose handler waits in Recv: the client gets the
// status at once, the handler's Recv fails, and the status the handler
// then returns is not sent.
func TestEndFuncEndsAWaitingStream(t *testing.T) {
	if EndFunc(context.Background()) != nil {
		t.Fatal("EndFunc of a context that is no stream's")
	}
	recvErr := make(chan error, 1)
	ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		end := EndFunc(s.Context())
		if end == nil {
			return status.Error(codes.Internal, "no EndFunc")
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
		// The first message arrived; the stream is ended from elsewhere
		// (a timer) while this handler waits for the next.
		go end(status.Error(codes.DeadlineExceeded, "ended by its bound"))
		_, err := s.Recv()
		recvErr <- err
		return status.Error(codes.Unavailable, "the handler's own status")
	})
	c, err := extprocv3.NewExternalProcessorClient(ts.client(t)).Process(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Send(&extprocv3.ProcessingRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recv(); status.Code(err) != codes.DeadlineExceeded || status.Convert(err).Message() != "ended by its bound" {
		t.Fatalf("the client got %v, want the end's DeadlineExceeded", err)
	}
	if err := <-recvErr; status.Code(err) != codes.Canceled {
		t.Fatalf("the handler's Recv: %v, want Canceled", err)
	}
}

// A drain (GracefulStop) while a peer has connected and not yet sent its
// preface closes that connection and returns. Before, it wrote its GOAWAY
// through a framer not yet made and the process panicked (found by
// TestStress in CI).
func TestGracefulStopWhileAPeerConnects(t *testing.T) {
	ts := serve(t, Options{}, echo)
	c, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The server has the connection (its reader waits for the preface).
	eventually(t, "the server has the connection", func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return len(ts.conns) == 1
	})
	done := make(chan struct{})
	go func() { ts.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop waits on a connection that never sent its preface")
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection is still open")
	}
}
