package envoysim

import (
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// serveAt serves proc on addr (port 0: any), stopped at cleanup or by the
// returned func.
func serveAt(t *testing.T, addr string, proc extprocv3.ExternalProcessorServer) (string, func()) {
	t.Helper()
	var ln net.Listener
	var err error
	// A port just closed can take a moment to be free again.
	for i := 0; i < 100; i++ {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, proc)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String(), gs.Stop
}

// A processor that comes back is used by the next stream: Envoy's
// connection pool makes a connection when a stream needs one, with no
// back-off (docs/envoy.md, "Reconnecting to fusebox"). Before, envoysim's
// gRPC client kept grpc-go's default back-off, so after 3 s down the first
// attempt to reconnect came seconds after the processor was back, and the
// e2e TestFuseboxKilledAndRestarted failed on a busy machine.
func TestRestartedProcessorIsUsedAtOnce(t *testing.T) {
	proc := &scripted{script: plain}
	addr, stop := serveAt(t, "127.0.0.1:0", proc)
	r := newRig(t, plain, func(c *Config) { c.ExtProc.Addr = addr; c.ExtProc.FailureModeAllow = true })
	seen := func() int { return len(proc.requests()) }
	if r.post(`{}`); seen() == 0 {
		t.Fatal("the processor saw nothing")
	}
	before := seen()
	stop()
	down := time.Now()
	for time.Since(down) < 3*time.Second {
		if resp, _ := r.post(`{}`); resp.StatusCode != 200 {
			t.Fatalf("processor down: %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if seen() != before {
		t.Fatal("a stopped processor saw a request")
	}
	serveAt(t, addr, proc)
	back := time.Now()
	for seen() == before {
		if time.Since(back) > time.Second {
			t.Fatalf("the restarted processor was not used for %v", time.Since(back))
		}
		r.post(`{}`)
	}
}

// An observer side stream that cannot open is over at once: the filter's
// stream failed and the response went on without it. Before, envoysim's
// stream stayed open until the deferred close, and every request through
// the observer profile with fusebox down waited that long in the e2e tests.
func TestObserverDownIsOverAtOnce(t *testing.T) {
	r := observerRig(t, routeWithMetadata, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return nil },
		func(c *Config) {
			c.Observer.Addr = "127.0.0.1:1"
			c.Observer.FailureModeAllow = true
			// An hour: a stream that waited for its deferred close would
			// never end within the wait below (before, a 5 s close and a
			// 1 s bound on the wall clock).
			c.Observer.DeferredClose = time.Hour
		})
	resp, _ := r.post(`{"model":"m"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	if !r.proxy.WaitObserver(resp.Header.Get(RequestHeader), 30*time.Second) {
		t.Fatal("the failed observer stream did not end: it waited for its deferred close")
	}
	if r.proxy.Stats().Get("observer_send_errors") == 0 {
		t.Fatal("the observer stream did not fail")
	}
}
