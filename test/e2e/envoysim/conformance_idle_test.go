package envoysim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The stream idle timeout (idle.go; docs/envoy.md, "Response flags fusebox
// judges"): a provider that never sends its headers meets it before a
// longer route timeout, a 504 with SI that the ext_proc response path is
// shown (1.37+) with its flags; one that stalls after its headers has its
// stream reset, SI on the entry; one that keeps sending, however slowly,
// never meets it. Before, envoysim played no idle timeout: a stalled
// provider always ended in the route timeout's UT.
func TestStreamIdleTimeout(t *testing.T) {
	cases := []struct {
		name    string
		serve   func(w http.ResponseWriter, r *http.Request)
		status  int
		flagged bool
		reset   bool
	}{
		{"no headers", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, 504, true, false},
		{"stalls after its headers", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, 200, true, true},
		{"slow but moving", func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i < 5; i++ {
				io.WriteString(w, "data: x\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(60 * time.Millisecond)
			}
		}, 200, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, plain, func(c *Config) {
				c.Envoy = Envoy140
				c.StreamIdleTimeout = 250 * time.Millisecond
				c.RouteTimeout = 5 * time.Second
			})
			r.up = newUpstream(t, tc.serve)
			r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(r.up.srv.URL, "http://")
			req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/x", strings.NewReader(`{}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || (rerr != nil) != tc.reset {
				t.Fatalf("status %d read error %v, want %d reset %v", resp.StatusCode, rerr, tc.status, tc.reset)
			}
			eventually(t, func() bool { return len(r.proxy.Log()) == 1 })
			e := r.proxy.Log()[0]
			if got := e.Flags&flagSI != 0; got != tc.flagged {
				t.Fatalf("SI %v, want %v (flags %#x, details %q)", got, tc.flagged, e.Flags, e.Details)
			}
			if tc.status == 504 {
				if e.Details != "stream_idle_timeout" {
					t.Fatalf("details %q", e.Details)
				}
				// The local reply reached the response path with its flag.
				sawSI := false
				r.proc.mu.Lock()
				defer r.proc.mu.Unlock()
				for _, m := range r.proc.seen {
					if m.GetResponseHeaders() != nil {
						sawSI = m.Attributes[attrKey].GetFields()["response.flags"].GetNumberValue() == float64(flagSI)
					}
				}
				if !sawSI {
					t.Fatal("the processor was not shown the 504 with SI")
				}
			}
		})
	}
}

// A client that goes away before the response gets nothing written and
// its entry carries DC with code 0; the processor is shown no response,
// only its stream's end. Before, envoysim invented a 503 (UR) and sent it
// through the response path.
func TestClientGoneBeforeHeaders(t *testing.T) {
	r := newRig(t, plain, func(c *Config) { c.Envoy = Envoy140 })
	arrived := make(chan struct{})
	r.up = newUpstream(t, func(w http.ResponseWriter, req *http.Request) {
		close(arrived)
		<-req.Context().Done()
	})
	r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(r.up.srv.URL, "http://")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", r.proxy.URL()+"/v1/x", strings.NewReader(`{}`))
	go func() { <-arrived; cancel() }()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("the request was answered")
	}
	eventually(t, func() bool { return len(r.proxy.Log()) == 1 })
	e := r.proxy.Log()[0]
	if e.Flags != flagDC || e.Status != 0 || e.Details != "downstream_remote_disconnect" {
		t.Fatalf("entry flags %#x status %d details %q, want DC, 0, downstream_remote_disconnect", e.Flags, e.Status, e.Details)
	}
	r.proc.mu.Lock()
	defer r.proc.mu.Unlock()
	for _, m := range r.proc.seen {
		if _, ok := m.Request.(*extprocv3.ProcessingRequest_ResponseHeaders); ok {
			t.Fatal("the processor was shown a response the client never got")
		}
	}
}

// eventually polls cond for up to 5 s (the proxy records its entry after
// the response is written).
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("the condition never held")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRouteTimeoutCutsAFlowingAnswer: the route timeout that fires after
// the response's headers (router.cc onResponseTimeout → onUpstreamAbort)
// resets the downstream stream and sets UT; the entry keeps the upstream's
// 200 and its via_upstream details. In the failover path too, where the
// answer goes downstream through the attempt's upstream filter. Before,
// envoysim set no flag: the entry was a plain 200 that the access log
// channel judged a client_cancel.
func TestRouteTimeoutCutsAFlowingAnswer(t *testing.T) {
	serve := func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
	r := newRig(t, plain, func(c *Config) {
		c.Envoy = Envoy140
		c.StreamIdleTimeout = 5 * time.Second
		c.RouteTimeout = 300 * time.Millisecond
	})
	r.up = newUpstream(t, serve)
	r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(r.up.srv.URL, "http://")
	req, _ := http.NewRequest("POST", r.proxy.URL()+"/v1/x", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rerr == nil {
		t.Fatalf("status %d read error %v, want 200 and a reset", resp.StatusCode, rerr)
	}
	eventually(t, func() bool { return len(r.proxy.Log()) == 1 })
	e := r.proxy.Log()[0]
	if e.Flags&flagUT == 0 || e.Flags&flagSI != 0 || e.Status != 200 || e.Details != "via_upstream" {
		t.Fatalf("entry flags %#x status %d details %q, want UT, 200, via_upstream", e.Flags, e.Status, e.Details)
	}
}
