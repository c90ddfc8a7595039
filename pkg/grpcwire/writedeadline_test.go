package grpcwire

import (
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
)

// #50: a peer that stops reading fails the connection's writers at the
// write deadline: the handler's send returns and the connection closes.
// Before, writes had no deadline: the writer blocked on the full socket
// for as long as the peer did not read, and everything that needed the
// connection's writing side (ending any of its streams, the sweep of the
// stream bounds) waited with it.
func TestAPeerThatStopsReadingIsCutAtTheWriteDeadline(t *testing.T) {
	sendErr := make(chan error, 1)
	ts := serve(t, Options{WriteTimeout: 300 * time.Millisecond, MaxRecvMsgSize: 8 << 20}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		body := make([]byte, 1<<20)
		for {
			r := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: body}}}
			if err := s.Send(r); err != nil {
				sendErr <- err
				return err
			}
		}
	})
	r := dialRaw(t, ts.addr)
	// Windows wide open, then never read again.
	if err := r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}); err != nil {
		t.Fatal(err)
	}
	if err := r.fr.WriteWindowUpdate(0, 1<<31-1-65535); err != nil {
		t.Fatal(err)
	}
	r.headers(1, false, envoyHeaders(processPath)...)
	r.data(1, false, msg(&extprocv3.ProcessingRequest{}))
	select {
	case err := <-sendErr:
		if err == nil {
			t.Fatal("no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's send still blocks 10 s after the peer stopped reading")
	}
}
