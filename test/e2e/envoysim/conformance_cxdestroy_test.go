package envoysim

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// hangUp closes the connection of the request w answers: with a reset
// (SO_LINGER 0, the way Linux ends the connections still queued on a
// listener that closes) or a plain FIN.
func hangUp(t *testing.T, w http.ResponseWriter, reset bool) {
	c, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	if tc, ok := c.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// A connection the upstream closes while the attempt's response is
// incomplete is counted once per attempt in
// cluster.<name>.upstream_cx_destroy_remote_with_active_rq, as Envoy's
// pool counts it (conn_pool_base.cc, onConnectionEvent,
// reportUpstreamCxDestroyActiveRequest), before the headers or after
// them; the access log's upstream_reset_after_response_started entries
// tell the second kind; a close of envoysim's own (the client gone) is
// local and counted in neither, nor is a connect failure. On both paths:
// the router's retries (proxy.go) and in-request failover (failover.go).
func TestRemoteCloseWithActiveRequestStats(t *testing.T) {
	toChosen := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
		}
		return plain(req)
	}
	type want struct{ remote, after, eject int }
	for _, tc := range []struct {
		name     string
		failover bool
		// serve answers the attempt; got is closed once it has the
		// request (for the case whose client then goes away).
		serve  func(t *testing.T, w http.ResponseWriter, r *http.Request, got chan<- struct{})
		cancel bool // the client goes away once the upstream has the request
		status int  // what the client sees (0: it went away)
		want   want
	}{
		{
			name:   "reset before the headers, retried once",
			serve:  func(t *testing.T, w http.ResponseWriter, _ *http.Request, _ chan<- struct{}) { hangUp(t, w, true) },
			status: 503, want: want{remote: 2},
		},
		{
			name:   "closed before the headers, retried once",
			serve:  func(t *testing.T, w http.ResponseWriter, _ *http.Request, _ chan<- struct{}) { hangUp(t, w, false) },
			status: 503, want: want{remote: 2},
		},
		{
			name: "reset after the headers",
			serve: func(t *testing.T, w http.ResponseWriter, _ *http.Request, _ chan<- struct{}) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				hangUp(t, w, true)
			},
			status: 200, want: want{remote: 1, after: 1},
		},
		{
			name: "the client goes away: a local close",
			serve: func(t *testing.T, w http.ResponseWriter, r *http.Request, got chan<- struct{}) {
				close(got)
				<-r.Context().Done()
			},
			cancel: true,
		},
		{
			name:   "a whole answer",
			serve:  func(t *testing.T, w http.ResponseWriter, _ *http.Request, _ chan<- struct{}) { io.WriteString(w, "ok") },
			status: 200,
		},
		{
			name:     "failover: reset before the headers, retried once",
			failover: true,
			serve:    func(t *testing.T, w http.ResponseWriter, _ *http.Request, _ chan<- struct{}) { hangUp(t, w, true) },
			status:   503, want: want{remote: 2},
		},
		{
			name:     "failover: reset after the headers",
			failover: true,
			serve: func(t *testing.T, w http.ResponseWriter, _ *http.Request, _ chan<- struct{}) {
				io.WriteString(w, strings.Repeat("x", 64<<10))
				w.(http.Flusher).Flush()
				hangUp(t, w, true)
			},
			status: 200, want: want{remote: 1, after: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan struct{})
			handler := func(w http.ResponseWriter, r *http.Request) { tc.serve(t, w, r, got) }
			var (
				proxy   *Proxy
				cluster = "chosen"
			)
			if tc.failover {
				cluster = "c1"
				fr := newFailoverRig(t, nil, []string{"c1"}, 1, nil, func(c *Config) {
					u := newUpstream(t, handler)
					c.Clusters["c1"] = &Cluster{Addr: strings.TrimPrefix(u.srv.URL, "http://")}
				})
				proxy = fr.proxy
			} else {
				r := newRig(t, toChosen, func(c *Config) {
					u := newUpstream(t, handler)
					c.Clusters["chosen"] = &Cluster{Addr: strings.TrimPrefix(u.srv.URL, "http://")}
				})
				proxy = r.proxy
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() { <-got; cancel() }()
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", proxy.URL()+"/v1/x", strings.NewReader(`{}`))
			req.Header.Set("Content-Type", "application/json")
			status := 0
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			if status != tc.status {
				t.Fatalf("the client saw %d, want %d", status, tc.status)
			}
			// The entry is written as the request ends, after the client
			// has its answer (or has gone).
			waitFor(t, "the request's access log entry", func() bool { return len(proxy.Log()) > 0 })
			st := proxy.Stats()
			g := want{
				remote: st.Get("cluster." + cluster + "." + statDestroyRemote),
				after:  st.Get(statResetAfter + cluster),
				eject:  st.Get("cluster." + cluster + ".upstream_rq_pending_failure_eject"),
			}
			if g != tc.want {
				t.Fatalf("counted %+v, want %+v", g, tc.want)
			}
			if all := st.Get(statDestroyRemote); all != tc.want.remote {
				t.Fatalf("%d in all, want %d (this cluster's)", all, tc.want.remote)
			}
		})
	}
}

// queuedWithData reports whether a connection to port sits established in
// a listener's accept queue with bytes it has received (the request),
// from /proc/net/tcp: the kernel took both before any Accept.
func queuedWithData(t *testing.T, port int) bool {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatalf("no /proc/net/tcp: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 || f[3] != "01" { // ESTABLISHED
			continue
		}
		local := strings.Split(f[1], ":")
		queues := strings.Split(f[4], ":")
		if len(local) != 2 || len(queues) != 2 {
			continue
		}
		lp, _ := strconv.ParseInt(local[1], 16, 32)
		rx, _ := strconv.ParseInt(queues[1], 16, 64)
		if int(lp) == port && rx > 0 {
			return true
		}
	}
	return false
}

// The soak's refused fault closes the provider's listener. Linux resets
// each connection still in its accept queue (the provider never saw it,
// so it tallies nothing), and the attempt on it loses its connection
// before the headers, with a read error, not a dial error: a remote close
// with an active request, as Envoy counts it, then the retry's refused
// connection a connect failure.
func TestABacklogResetIsARemoteClose(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	toChosen := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}})
		}
		return plain(req)
	}
	r := newRig(t, toChosen, func(c *Config) { c.Clusters["chosen"].Addr = ln.Addr().String() })
	status := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/x", strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	waitFor(t, "the request queued on the listener", func() bool { return queuedWithData(t, port) })
	ln.Close()
	if got := <-status; got != 503 {
		t.Fatalf("the client saw %d, want 503", got)
	}
	waitFor(t, "the request's access log entry", func() bool { return len(r.proxy.Log()) > 0 })
	st := r.proxy.Stats()
	if got := st.Get("cluster.chosen." + statDestroyRemote); got != 1 {
		t.Fatalf("%s %d, want 1: the queued connection's reset", statDestroyRemote, got)
	}
	if got := st.Get("cluster.chosen.upstream_rq_pending_failure_eject"); got != 1 {
		t.Fatalf("upstream_rq_pending_failure_eject %d, want 1: the retry, refused", got)
	}
	if got := st.Get(statResetAfter + "chosen"); got != 0 {
		t.Fatalf("%d resets after the response started, want 0", got)
	}
}
