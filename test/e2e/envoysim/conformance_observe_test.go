package envoysim

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The observer profile (docs/envoy.md, "Observability mode"): a second
// ext_proc filter with observability_mode, played as Envoy's filter does.
func observerRig(t *testing.T, route, observe func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse, mod ...func(*Config)) *rig {
	t.Helper()
	r := newRig(t, nil, append([]func(*Config){func(c *Config) {
		c.ExtProc.ResponseHeaderMode = filterv3.ProcessingMode_SKIP
		c.ExtProc.ResponseBodyMode = filterv3.ProcessingMode_NONE
		c.ExtProc.ReceivingNamespaces = []string{"fusebox", "fusebox.observe"}
		o := c.ExtProc
		o.InitialMetadata = map[string]string{"x-fusebox-role": "observe"}
		o.ObservabilityMode = true
		o.RequestHeaderMode = filterv3.ProcessingMode_SKIP
		o.RequestBodyMode = filterv3.ProcessingMode_NONE
		o.ResponseHeaderMode = filterv3.ProcessingMode_SEND
		o.ResponseBodyMode = filterv3.ProcessingMode_STREAMED
		o.ForwardingNamespaces = []string{"fusebox.observe"}
		o.DeferredClose = 50 * time.Millisecond
		c.Observer = &o
		c.ResponseHeadersToAdd = []HeaderToAdd{{Key: "x-fusebox-route", Value: "%DYNAMIC_METADATA(fusebox:route)%"}}
		c.ChunkDelays = true
	}}, mod...)...)
	r.proc.script = nil
	r.proc.byRole = func(role string, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if role == "observe" {
			return observe(req)
		}
		return route(req)
	}
	return r
}

// The route role routes and sets metadata; the observer answers nothing.
func routeWithMetadata(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if req.GetRequestHeaders() != nil {
		resp := reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-fusebox-cluster", "chosen")}}, ClearRouteCache: true})
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			"fusebox":         structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"decision": structpb.NewStringValue("d1"), "route": structpb.NewStringValue("r:1")}}),
			"fusebox.observe": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"note": structpb.NewStringValue("n")}}),
		}}
		return resp
	}
	return plain(req)
}

func (s *scripted) byRoleSeen(role string) []*extprocv3.ProcessingRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*extprocv3.ProcessingRequest
	for i, md := range s.mdOf {
		if v := md; v == role {
			out = append(out, s.seen[i])
		}
	}
	return out
}

// What the observer is sent, and what it changes: the response headers and
// every STREAMED chunk, each with observability_mode and the forwarded
// metadata, no protocol_config; replies (even an immediate response) are
// ignored; the response reaches the client whole and unchanged, with the
// route header from the route role's metadata.
func TestObservabilityModeSendsAndIgnores(t *testing.T) {
	r := observerRig(t, routeWithMetadata, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		// A processor that tries to change the response: ignored.
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: []byte("no")}}}
	})
	resp, body := r.post(`{"model":"m"}`)
	if resp.StatusCode != 200 || body != "data: one\n\ndata: two\n\ndata: [DONE]\n\n" {
		t.Fatalf("the observer changed the response: %d %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("x-fusebox-route"); got != "r:1" {
		t.Fatalf("x-fusebox-route %q, want the route role's fusebox.route", got)
	}
	if !r.proxy.WaitObserver(resp.Header.Get(RequestHeader), 2*time.Second) {
		t.Fatal("the observer stream never ended")
	}
	obs := r.proc.byRoleSeen("observe")
	if len(obs) < 2 {
		t.Fatalf("the observer saw %d messages", len(obs))
	}
	if obs[0].GetResponseHeaders() == nil {
		t.Fatalf("the observer's first message: %v", obs[0])
	}
	eos := false
	for _, m := range obs {
		if !m.ObservabilityMode || m.ProtocolConfig != nil {
			t.Fatalf("observability_mode %v, protocol_config %v", m.ObservabilityMode, m.ProtocolConfig)
		}
		if m.GetRequestHeaders() != nil || m.GetRequestBody() != nil {
			t.Fatal("the observer was sent the request")
		}
		md := m.GetMetadataContext().GetFilterMetadata()
		if md["fusebox"] != nil || md["fusebox.observe"].GetFields()["note"].GetStringValue() != "n" {
			t.Fatalf("metadata_context %v: the forwarding namespaces are not there", md)
		}
		eos = eos || m.GetResponseBody().GetEndOfStream()
	}
	if !eos {
		t.Fatal("the observer never saw the body's end")
	}
	for _, m := range r.proc.byRoleSeen("route") {
		if m.GetResponseHeaders() != nil || m.GetResponseBody() != nil {
			t.Fatal("the route role (response SKIP/NONE) was sent the response")
		}
	}
	if r.proxy.Stats().Get("observer_replies_ignored") == 0 {
		t.Fatal("the observer's replies were not read (and ignored)")
	}
}

// No chunk waits for the observer: with the observer holding its first
// message and not answering, the client still gets its whole response,
// where the synchronous filter adds a processor's time to every chunk.
// Judged by what happens, not by a time: before, the bounds (the response
// within 400 ms behind a 500 ms-per-message observer) were a loaded
// machine's to break.
func TestObservabilityModeNeverWaits(t *testing.T) {
	held, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	stuck := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		select {
		case held <- struct{}{}:
		default:
		}
		<-release
		return nil
	}
	// A synchronous filter would wait for its message timeout, then go
	// on (failure_mode_allow): an hour makes any wait the test's hang.
	r := observerRig(t, routeWithMetadata, stuck, func(c *Config) { c.Observer.MessageTimeout = time.Hour })
	done := make(chan int, 1)
	go func() {
		resp, _ := r.post(`{"model":"m"}`)
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		if code != 200 {
			t.Fatalf("status %d behind an observer that never answers", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the response waits for an observer that never answers")
	}
	select { // sent, and never answered
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the observer was sent nothing: the test proves nothing")
	}
	// The synchronous profile, same processor on the response: each chunk
	// waits for its reply.
	sync := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetResponseBody() != nil {
			time.Sleep(30 * time.Millisecond)
		}
		return plain(req)
	}, func(c *Config) { c.ChunkDelays = true })
	sync.post(`{"model":"m"}`)
	waited := 0
	for _, d := range sync.proxy.Stats().ChunkDelays() {
		if d >= 25*time.Millisecond {
			waited++
		}
	}
	if waited == 0 {
		t.Fatal("the synchronous filter's chunks did not wait: the comparison proves nothing")
	}
}

// Envoy 1.34–1.36 does not show a local reply to the observer either
// (processing is complete before encodeHeaders); 1.40 does.
func TestObservabilityModeLocalReplies(t *testing.T) {
	for _, v := range []struct {
		name  string
		envoy Version
		sees  bool
	}{{"1.36", Envoy136, false}, {"1.40", Envoy140, true}} {
		r := observerRig(t, routeWithMetadata, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return nil },
			func(c *Config) { c.Envoy = v.envoy; c.Clusters["chosen"].Addr = "127.0.0.1:1" })
		resp, _ := r.post(`{"model":"m"}`)
		if resp.StatusCode != 503 {
			t.Fatalf("%s: %d", v.name, resp.StatusCode)
		}
		r.proxy.WaitObserver(resp.Header.Get(RequestHeader), 2*time.Second)
		if got := len(r.proc.byRoleSeen("observe")) > 0; got != v.sees {
			t.Fatalf("%s: the observer saw the local reply: %v, want %v", v.name, got, v.sees)
		}
	}
}

// The route role's immediate response (fusebox's fail-fast 503) is a local
// reply through the encoder chain: from 1.37 the observer sees it, with its
// details (fusebox_<code>) and no flag, and with no note; 1.34–1.36 skip
// it. Before, envoysim never showed an immediate response to the observer.
func TestObserverSeesImmediateResponses(t *testing.T) {
	failFast := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
				Status: &typev3.HttpStatus{Code: 503}, Body: []byte(`{"error":{}}`), Details: "fusebox_all_routes_open"}}}
		}
		return nil
	}
	for _, v := range []struct {
		name  string
		envoy Version
		sees  bool
	}{{"1.36", Envoy136, false}, {"1.40", Envoy140, true}} {
		r := observerRig(t, failFast, func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return nil },
			func(c *Config) { c.Envoy = v.envoy })
		resp, _ := r.post(`{"model":"m"}`)
		if resp.StatusCode != 503 {
			t.Fatalf("%s: %d", v.name, resp.StatusCode)
		}
		eventually(t, func() bool { return !v.sees || len(r.proc.byRoleSeen("observe")) > 0 })
		seen := r.proc.byRoleSeen("observe")
		if got := len(seen) > 0; got != v.sees {
			t.Fatalf("%s: the observer saw the immediate response: %v, want %v", v.name, got, v.sees)
		}
		if !v.sees {
			continue
		}
		h := seen[0]
		details := h.Attributes[attrKey].GetFields()["response.code_details"].GetStringValue()
		if h.GetResponseHeaders() == nil || details != "fusebox_all_routes_open" || len(h.GetMetadataContext().GetFilterMetadata()["fusebox.observe"].GetFields()) != 0 {
			t.Fatalf("%s: the observer saw %v with details %q", v.name, h, details)
		}
	}
}

// The observer's side-stream buffer is the fusebox cluster's HTTP/2
// initial_stream_window_size (#35): a fusebox that stops reading slows the
// response once that much is queued, and not before. A 64 KiB window pauses a
// 1 MiB response; the release default (16 MiB on 1.36+) does not. Before, the
// harness paused at a fixed 1 MiB whatever the file said.
func TestObserverBufferIsTheClusterWindow(t *testing.T) {
	big := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := "data: " + strings.Repeat("x", 16<<10) + "\n\n"
		for i := 0; i < 64; i++ {
			io.WriteString(w, chunk)
			w.(http.Flusher).Flush()
		}
	}
	for _, tc := range []struct {
		name   string
		window int
		pauses bool
	}{{"64 KiB window", 64 << 10, true}, {"release default", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var once sync.Once
			stuck := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				<-release // a fusebox that stopped reading
				return nil
			}
			r := observerRig(t, routeWithMetadata, stuck, func(c *Config) {
				c.Envoy = Envoy140
				c.Observer.StreamWindow = tc.window
			})
			r.up = newUpstream(t, big)
			r.proxy.cfg.Clusters["chosen"].Addr = strings.TrimPrefix(r.up.srv.URL, "http://")
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			done := make(chan int, 1)
			go func() {
				resp, body := r.post(`{"model":"m"}`)
				if len(body) < 1<<20 {
					t.Errorf("the client got %d bytes", len(body))
				}
				done <- resp.StatusCode
			}()
			deadline := time.After(20 * time.Second)
			released := false
			for {
				select {
				case code := <-done:
					if tc.pauses && !released {
						t.Fatalf("the response (%d) went through a stuck observer with a %d-byte window", code, tc.window)
					}
					if n := r.proxy.Stats().Get("observer_high_watermark"); !tc.pauses && n != 0 {
						t.Fatalf("paused %d times below the release default window", n)
					}
					return
				case <-deadline:
					t.Fatal("the response never finished")
				case <-time.After(10 * time.Millisecond):
				}
				if tc.pauses && !released && r.proxy.Stats().Get("observer_high_watermark") > 0 {
					// Paused at the watermark: let fusebox read, and the
					// response finishes.
					once.Do(func() { close(release) })
					released = true
				}
			}
		})
	}
}
