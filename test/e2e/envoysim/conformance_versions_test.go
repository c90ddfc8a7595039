package envoysim

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// These hold envoysim to the per-release facts of docs/envoy.md
// ("Envoy's own local replies and ext_proc", "The access log channel").

// TestLocalRepliesPerRelease: the router's local reply (a refused
// connection) reaches the processor's response path on 1.33, 1.37+ and on
// 1.34–1.36 with the runtime guard false; on 1.34–1.36 (and the backports)
// it does not: the processor sees the request phase, then its stream
// ending.
func TestLocalRepliesPerRelease(t *testing.T) {
	cases := []struct {
		v       Version
		runtime map[string]string
		sent    bool
	}{
		{Version{1, 33, 0}, nil, true},
		{Version{1, 33, 1}, nil, false}, // backport
		{Version{1, 32, 3}, nil, true},
		{Version{1, 32, 4}, nil, false},
		{Version{1, 31, 6}, nil, false},
		{Version{1, 30, 10}, nil, false},
		{Version{1, 34, 0}, nil, false},
		{Envoy136, nil, false},
		{Envoy136, map[string]string{skipGuard: "false"}, true},
		{Version{1, 37, 0}, nil, true},
		{Envoy140, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.v.String(), func(t *testing.T) {
			r := newRig(t, plain, func(c *Config) {
				c.Clusters["default"].Addr = "127.0.0.1:1"
				c.Envoy, c.Runtime = tc.v, tc.runtime
				c.ExtProc.FailureModeAllow = true
			})
			resp, _ := r.post(`{}`)
			if resp.StatusCode != 503 {
				t.Fatalf("%d", resp.StatusCode)
			}
			got := false
			for _, q := range r.proc.requests() {
				if q.GetResponseHeaders() != nil {
					got = true
				}
			}
			if got != tc.sent {
				t.Fatalf("local reply sent to the processor: %v, want %v", got, tc.sent)
			}
		})
	}
}

// recordingALS is an access log service that keeps what it is sent.
type recordingALS struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	mu      sync.Mutex
	ids     []*accesslogv3.StreamAccessLogsMessage_Identifier
	entries []*accesslogdatav3.HTTPAccessLogEntry
}

func (a *recordingALS) StreamAccessLogs(s accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		a.mu.Lock()
		if m.Identifier != nil {
			a.ids = append(a.ids, m.Identifier)
		}
		a.entries = append(a.entries, m.GetHttpLogs().GetLogEntry()...)
		a.mu.Unlock()
	}
}

func (a *recordingALS) got() []*accesslogdatav3.HTTPAccessLogEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*accesslogdatav3.HTTPAccessLogEntry(nil), a.entries...)
}

func startALS(t *testing.T) (*recordingALS, string) {
	als := &recordingALS{}
	return als, startProcessor(t, nil, als)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestAccessLogEntry: what the http_grpc logger writes (grpc_access_log_
// utils.cc): the identifier on the stream's first message; per request,
// flags as booleans, upstream_cluster only once a host was picked (a
// connect failure yes, no cluster not), every dynamic metadata namespace
// the processor set, the code and its details; the response_flag_filter
// drops a request without those flags; buffer_size_bytes 0 sends each
// entry at once.
func TestAccessLogEntry(t *testing.T) {
	als, addr := startALS(t)
	withDecision := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		resp := plain(req)
		if req.GetRequestBody() != nil {
			resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
				"fusebox": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"decision": structpb.NewStringValue("d-1")}})}}
		}
		return resp
	}
	r := newRig(t, withDecision, func(c *Config) {
		c.AccessLog = &AccessLogConfig{Addr: addr, LogName: "fusebox", Flags: []string{"UF", "NC"}}
	})
	r.post(`{}`) // 200 from the default cluster: filtered out
	r.proxy.cfg.Clusters["default"].Addr = "127.0.0.1:1"
	r.post(`{}`) // refused: UF (and URX after the retry)
	delete(r.proxy.cfg.Clusters, "default")
	r.post(`{}`) // no cluster: NC
	waitFor(t, "two entries, sent at once", func() bool { return len(als.got()) == 2 })
	es := als.got()
	uf, nc := es[0], es[1]
	if f := uf.GetCommonProperties().GetResponseFlags(); !f.GetUpstreamConnectionFailure() || !f.GetUpstreamRetryLimitExceeded() || f.GetNoClusterFound() {
		t.Fatalf("UF entry flags %v", f)
	}
	if uf.GetCommonProperties().GetUpstreamCluster() != "default" || uf.GetResponse().GetResponseCode().GetValue() != 503 ||
		uf.GetResponse().GetResponseCodeDetails() != "upstream_reset_before_response_started{remote_connection_failure}" {
		t.Fatalf("UF entry %v", uf)
	}
	if id := uf.GetCommonProperties().GetMetadata().GetFilterMetadata()["fusebox"].GetFields()["decision"].GetStringValue(); id != "d-1" {
		t.Fatalf("metadata %v", uf.GetCommonProperties().GetMetadata())
	}
	if !nc.GetCommonProperties().GetResponseFlags().GetNoClusterFound() || nc.GetCommonProperties().GetUpstreamCluster() != "" {
		t.Fatalf("NC entry %v", nc)
	}
	als.mu.Lock()
	ids := als.ids
	als.mu.Unlock()
	if len(ids) != 1 || ids[0].GetLogName() != "fusebox" {
		t.Fatalf("identifiers %v", ids)
	}
}

// TestAccessLogBuffered: with buffer_size_bytes above an entry's size, an
// entry waits for the flush interval (1 s), as Envoy's default 16 KiB
// buffer does: the shipped configs set 0 for that reason.
func TestAccessLogBuffered(t *testing.T) {
	als, addr := startALS(t)
	r := newRig(t, plain, func(c *Config) {
		c.AccessLog = &AccessLogConfig{Addr: addr, BufferSizeBytes: 16 << 10}
		c.Clusters["default"].Addr = "127.0.0.1:1"
	})
	start := time.Now()
	r.post(`{}`)
	if len(als.got()) != 0 {
		t.Fatal("a buffered entry was sent at once")
	}
	waitFor(t, "the flush", func() bool { return len(als.got()) == 1 })
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("flushed after %s, want the 1 s interval", el)
	}
}

// TestStreamCloseOptimizationPerRelease (docs/envoy.md, "When Envoy
// closes the ext_proc stream"): from 1.37.0, a request headers reply that
// leaves nothing more to send (the body mode overridden to NONE, every
// response phase off: the observer profile with x-fusebox-model) closes the
// stream at once, while the upstream is still answering; on 1.36 and with
// the runtime guard false it stays open until the request ends. A BUFFERED
// body reply never closes it.
func TestStreamCloseOptimizationPerRelease(t *testing.T) {
	noMore := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			r := reqHeadersReply(nil)
			r.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_NONE,
				ResponseHeaderMode: filterv3.ProcessingMode_SKIP, ResponseBodyMode: filterv3.ProcessingMode_NONE}
			return r
		}
		return plain(req)
	}
	bodyThenNoMore := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(nil)
		}
		if req.GetRequestBody() != nil {
			r := reqBodyReply(nil)
			r.ModeOverride = &filterv3.ProcessingMode{ResponseHeaderMode: filterv3.ProcessingMode_SKIP, ResponseBodyMode: filterv3.ProcessingMode_NONE}
			return r
		}
		return plain(req)
	}
	cases := []struct {
		name    string
		v       Version
		runtime map[string]string
		script  func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		early   bool
	}{
		{"1.36: open until the end", Envoy136, nil, noMore, false},
		{"1.37: closed after the headers reply", Version{1, 37, 0}, nil, noMore, true},
		{"1.40: closed after the headers reply", Envoy140, nil, noMore, true},
		{"1.37, guard false", Version{1, 37, 0}, map[string]string{streamCloseGuard: "false"}, noMore, false},
		// 1.40.0 removed the guard (changelogs/1.40.0.yaml,
		// removed_config_or_runtime): a false is not read.
		{"1.40, guard false", Envoy140, map[string]string{streamCloseGuard: "false"}, noMore, true},
		{"1.40, a BUFFERED body reply", Envoy140, nil, bodyThenNoMore, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var answered atomic.Int64
			r := newRig(t, tc.script, func(c *Config) { c.Envoy, c.Runtime = tc.v, tc.runtime })
			slow := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
				time.Sleep(150 * time.Millisecond)
				answered.Store(time.Now().UnixNano())
				w.WriteHeader(200)
			})
			r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(slow.srv.URL, "http://")
			if resp, _ := r.post(`{"model":"m"}`); resp.StatusCode != 200 {
				t.Fatalf("%d", resp.StatusCode)
			}
			if early := streamEnd(t, r).UnixNano() < answered.Load(); early != tc.early {
				t.Fatalf("stream ended before the upstream answered: %v, want %v", early, tc.early)
			}
		})
	}
}

// TestStreamClosesAtEncodeHeaders: from 1.37, a stream whose encoding path
// sends nothing (the route role of the observer and failover profiles:
// response headers SKIP, body NONE) is closed as the response headers pass
// the filter (Filter::encodeHeaders), not at the request's end; one whose
// response headers are sent stays open past them, and 1.36 keeps every
// stream open to the end. The answer's body comes 300 ms after its
// headers.
func TestStreamClosesAtEncodeHeaders(t *testing.T) {
	// The route role's override: the body BUFFERED (the model is read
	// there), every response phase off.
	skipResponse := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			r := reqHeadersReply(nil)
			r.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_BUFFERED,
				ResponseHeaderMode: filterv3.ProcessingMode_SKIP, ResponseBodyMode: filterv3.ProcessingMode_NONE}
			return r
		}
		return plain(req)
	}
	cases := []struct {
		name    string
		v       Version
		script  func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		atHeads bool
	}{
		{"1.40, response path SKIP", Envoy140, skipResponse, true},
		{"1.37, response path SKIP", Version{1, 37, 0}, skipResponse, true},
		{"1.36, response path SKIP", Envoy136, skipResponse, false},
		{"1.40, response headers sent", Envoy140, plain, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var bodyAt atomic.Int64
			r := newRig(t, tc.script, func(c *Config) { c.Envoy = tc.v })
			slow := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("content-type", "application/json")
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				time.Sleep(300 * time.Millisecond)
				bodyAt.Store(time.Now().UnixNano())
				_, _ = w.Write([]byte(`{"ok":true}`))
			})
			r.proxy.cfg.Clusters["default"].Addr = strings.TrimPrefix(slow.srv.URL, "http://")
			if resp, _ := r.post(`{"model":"m"}`); resp.StatusCode != 200 {
				t.Fatalf("%d", resp.StatusCode)
			}
			if atHeads := streamEnd(t, r).UnixNano() < bodyAt.Load(); atHeads != tc.atHeads {
				t.Fatalf("stream ended before the answer's body: %v, want %v", atHeads, tc.atHeads)
			}
		})
	}
}

// TestAnEmptyFlagFilterWritesFlaggedEntries: Envoy's response_flag_filter
// with no flag listed writes the entries with any flag set
// (ResponseFlagFilter::evaluate, hasAnyResponseFlag); with no filter every
// entry is written. Before, envoysim wrote every entry for an empty list.
func TestAnEmptyFlagFilterWritesFlaggedEntries(t *testing.T) {
	for _, tc := range []struct {
		name       string
		flagFilter bool
		want       int // of a healthy request and a refused connection
	}{{"empty response_flag_filter", true, 1}, {"no filter", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			als, addr := startALS(t)
			r := newRig(t, plain, func(c *Config) { c.AccessLog = &AccessLogConfig{Addr: addr, FlagFilter: tc.flagFilter} })
			r.post(`{}`) // a healthy answer: no flag
			r.proxy.cfg.Clusters["default"].Addr = "127.0.0.1:1"
			r.post(`{}`) // a refused connection: UF
			waitFor(t, "the entries", func() bool { return len(als.got()) >= tc.want })
			time.Sleep(100 * time.Millisecond) // nothing more comes (entries go out at once)
			if got := len(als.got()); got != tc.want {
				t.Fatalf("%d entries, want %d", got, tc.want)
			}
		})
	}
}

// TestEnvoysimFailsClosedOnItsConfig: a runtime key envoysim does not
// play, or a response_flag_filter flag it cannot set, refuses the load.
// Before, they were read and ignored: a guard the harness does not play
// passed a test silently.
func TestEnvoysimFailsClosedOnItsConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"a played guard", Config{Runtime: map[string]string{skipGuard: "false"}}, true},
		{"a runtime key not played", Config{Runtime: map[string]string{"envoy.reloadable_features.ext_proc_fail_close_spurious_resp": "false"}}, false},
		{"a flag it cannot set", Config{AccessLog: &AccessLogConfig{Addr: "127.0.0.1:1", Flags: []string{"UF", "RL"}}}, false},
		{"a response attribute it does not send", Config{ExtProc: ExtProcConfig{ResponseAttributes: []string{"response.flags", "upstream.address"}}}, false},
		{"xds.cluster_name on the route role", Config{ExtProc: ExtProcConfig{RequestAttributes: []string{"xds.cluster_name"}}}, false},
		{"xds.cluster_name on the attempt role", Config{Failover: &FailoverConfig{Attempt: ExtProcConfig{RequestAttributes: []string{"xds.cluster_name"}}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if p != nil {
				p.Close()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestModeOverrideKeepsConfiguredHeaderModes: a DEFAULT header mode in a
// mode_override keeps the filter's configured mode (effectiveModeOverride);
// only the body modes are taken as they are. A filter configured with
// response headers SKIP whose server overrides just the request body mode
// is shown no response headers. Before, the DEFAULT replaced SKIP and read
// as SEND.
func TestModeOverrideKeepsConfiguredHeaderModes(t *testing.T) {
	bodyOnly := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			r := reqHeadersReply(nil)
			r.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_NONE}
			return r
		}
		return plain(req)
	}
	r := newRig(t, bodyOnly, func(c *Config) {
		c.ExtProc.ResponseHeaderMode = filterv3.ProcessingMode_SKIP
		c.ExtProc.ResponseBodyMode = filterv3.ProcessingMode_NONE
	})
	if resp, _ := r.post(`{"model":"m"}`); resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	r.proc.mu.Lock()
	defer r.proc.mu.Unlock()
	for _, m := range r.proc.seen {
		if m.GetResponseHeaders() != nil {
			t.Fatal("the processor was shown response headers its filter skips: the override's DEFAULT replaced SKIP")
		}
	}
}

// streamEnd waits (waitFor's 5 s at most) for the rig's one processor stream to end
// and says when it did.
func streamEnd(t *testing.T, r *rig) time.Time {
	t.Helper()
	waitFor(t, "the stream's end", func() bool {
		r.proc.mu.Lock()
		defer r.proc.mu.Unlock()
		return len(r.proc.ended) >= 1
	})
	r.proc.mu.Lock()
	defer r.proc.mu.Unlock()
	if len(r.proc.ended) != 1 {
		t.Fatalf("%d streams ended, want 1", len(r.proc.ended))
	}
	return r.proc.ended[0]
}

// protocol_config is sent on the first message from 1.34.0 only
// (docs/envoy/stream.md). Before, envoysim sent it on every release.
func TestProtocolConfigPerRelease(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		sent bool
	}{
		{Version{1, 32, 3}, false},
		{Version{1, 33, 2}, false},
		{Version{1, 34, 0}, true},
		{Envoy136, true},
		{Envoy140, true},
		{Version{}, true},
	} {
		t.Run(tc.v.String(), func(t *testing.T) {
			r := newRig(t, plain, func(c *Config) { c.Envoy = tc.v })
			r.post(`{}`)
			reqs := r.proc.requests()
			if len(reqs) == 0 {
				t.Fatal("no message")
			}
			if got := reqs[0].ProtocolConfig != nil; got != tc.sent {
				t.Fatalf("protocol_config sent %v, want %v", got, tc.sent)
			}
			for _, q := range reqs[1:] {
				if q.ProtocolConfig != nil {
					t.Fatal("protocol_config on a later message")
				}
			}
		})
	}
}
