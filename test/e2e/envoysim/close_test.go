package envoysim

import (
	"io"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// closeWatcher answers every message, and on the filter's half-close
// waits to see whether the stream is reset before it half-closes itself.
type closeWatcher struct {
	extprocv3.UnimplementedExternalProcessorServer
	reset chan bool
}

func (c *closeWatcher) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := st.Recv()
		if err == io.EOF {
			select {
			case <-st.Context().Done():
				c.reset <- true
			case <-time.After(300 * time.Millisecond):
				c.reset <- false
			}
			return nil
		}
		if err != nil {
			c.reset <- true
			return nil
		}
		if err := st.Send(plain(req)); err != nil {
			return nil
		}
	}
}

// ExternalProcessorStreamImpl::close: a half-close, then at once a reset,
// so nothing the server sends after the half-close is read; with the
// graceful close guard (1.34+) the filter waits for the server's own
// half-close. Before, envoysim half-closed and kept reading replies for a
// message timeout on every release.
func TestCloseIsAHalfCloseThenAReset(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v       Version
		runtime map[string]string
		reset   bool
	}{
		{"default", Envoy140, nil, true},
		{"graceful close guard", Envoy140, map[string]string{gracefulCloseGuard: "true"}, false},
		{"the guard before 1.34", Version{1, 33, 0}, map[string]string{gracefulCloseGuard: "true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &closeWatcher{reset: make(chan bool, 4)}
			gs := grpc.NewServer()
			extprocv3.RegisterExternalProcessorServer(gs, w)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go gs.Serve(ln)
			t.Cleanup(gs.Stop)
			r := newRig(t, plain, func(c *Config) {
				c.ExtProc.Addr = ln.Addr().String()
				c.Envoy, c.Runtime = tc.v, tc.runtime
			})
			if resp, _ := r.post(`{}`); resp.StatusCode != 200 {
				t.Fatalf("%d", resp.StatusCode)
			}
			select {
			case got := <-w.reset:
				if got != tc.reset {
					t.Fatalf("reset after the half-close: %v, want %v", got, tc.reset)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the stream never half-closed")
			}
		})
	}
}
