package mainlib

import (
	"context"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// The group stops what it started in the reverse order, once.
func TestComponentsStopInReverse(t *testing.T) {
	var got []string
	c := func(name string, withStart bool) component {
		cp := component{name: name, stop: func() { got = append(got, "stop "+name) }}
		if withStart {
			cp.start = func() { got = append(got, "start "+name) }
		}
		return cp
	}
	var g components
	g.add(c("clock", false), c("store", true))
	g.add(c("loop", true), c("server", true))
	g.stop()
	g.stop() // once: nothing left
	want := []string{"start store", "start loop", "start server", "stop server", "stop loop", "stop store", "stop clock"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

// A loop runs until stopped, and stopping waits for it to end.
func TestLoopStopWaitsForItsEnd(t *testing.T) {
	ended := false
	var g components
	g.add(loop("l", func(ctx context.Context) {
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond)
		ended = true
	}))
	g.stop()
	if !ended {
		t.Fatal("stop returned before the loop ended")
	}
}

// A Start that fails half-way (the admin address is taken) lets go of
// everything it had started: the clock's goroutine, the store, the
// ext_proc listener. Before, a listener that failed returned with the
// clock still ticking and the store open.
func TestAFailedStartLetsGoOfWhatItOpened(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := grpcLn.Addr().String()
	grpcLn.Close()
	base := runtime.NumGoroutine()
	for range 20 {
		_, err := Start(context.Background(), []string{"-grpc-addr", grpcAddr, "-admin-addr", taken.Addr().String()}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "listen.admin") {
			t.Fatalf("start: %v, want listen.admin refused", err)
		}
	}
	// The ext_proc address is free again.
	ln, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		t.Fatalf("the ext_proc listener was kept: %v", err)
	}
	ln.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after 20 failed starts, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
