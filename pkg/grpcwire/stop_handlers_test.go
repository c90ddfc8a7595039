package grpcwire

import (
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Stop and GracefulStop return after the handlers have, even those of a
// connection its peer already closed: fusebox stops its store's workers
// and its tracer after the server, and a handler's last record or span
// must come before. Before, a closed connection counted as done with its
// handler still running.
func TestStopsWaitForHandlers(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*Server)
	}{{"graceful", (*Server).GracefulStop}, {"stop", (*Server).Stop}} {
		t.Run(tc.name, func(t *testing.T) {
			release, in, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
			ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
				close(in)
				<-s.Context().Done()
				close(ended)
				<-release // what a handler does after its stream ended
				return nil
			})
			r := dialRaw(t, ts.addr)
			r.headers(1, false, envoyHeaders(processPath)...)
			<-in
			r.c.Close() // the peer goes away: its connection ends at once
			<-ended
			for conns := 1; conns > 0; time.Sleep(time.Millisecond) { // the server forgot the connection
				ts.Server.mu.Lock()
				conns = len(ts.Server.conns)
				ts.Server.mu.Unlock()
			}
			stopped := make(chan struct{})
			go func() { tc.stop(ts.Server); close(stopped) }()
			select {
			case <-stopped:
				t.Fatal("the server stopped with a handler still running")
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			<-stopped
		})
	}
}
