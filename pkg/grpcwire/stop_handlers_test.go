package grpcwire

import (
	"errors"
	"sync/atomic"
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

// A stream whose connection closes while its HEADERS are being read (Stop
// from another goroutine, between the stream's admission and its entry in
// the connection's table) must not leave a handler waiting for a wake
// that never comes: Stop waits for the handlers. Before, the stream was
// entered after the close had aborted the streams it knew, its handler
// waited in Recv for good, and Stop never returned (TestStress in a loaded
// CI run's poison step: ten minutes, then the binary's timeout).
func TestAStreamOpenedAsItsConnectionClosesHoldsNothing(t *testing.T) {
	ran := make(chan struct{}, 1)
	ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		ran <- struct{}{}
		_, err := s.Recv()
		return err
	})
	var closed atomic.Pointer[conn]
	openingHook = func(c *conn) { closed.Store(c); c.close(errors.New("the server stopped")) }
	t.Cleanup(func() { openingHook = nil })
	r := dialRaw(t, ts.addr)
	r.headers(1, false, envoyHeaders(processPath)...)
	for conns := 1; conns > 0; time.Sleep(time.Millisecond) { // the close took the connection
		ts.Server.mu.Lock()
		conns = len(ts.Server.conns)
		ts.Server.mu.Unlock()
	}
	stopped := make(chan struct{})
	go func() { ts.Server.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second): // a hang's bound
		// Let the stray handler go, so that the test ends (and its
		// server's cleanup with it) instead of hanging.
		c := closed.Load()
		c.mu.Lock()
		for _, st := range c.streams {
			defer st.abort(errors.New("the test gave up"), false, 0)
		}
		c.mu.Unlock()
		t.Fatal("Stop did not return: a handler waits on a stream its closed connection never ended")
	}
	select {
	case <-ran:
		t.Fatal("a handler ran for a stream opened on a closed connection")
	default:
	}
}
