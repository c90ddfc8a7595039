package envoysim

import (
	"net"
	"net/http"
	"strings"
	"testing"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// startProcessor serves a scripted processor and an access log service
// (either may be nil) on a new port.
func startProcessor(t *testing.T, s *scripted, als *recordingALS) string {
	t.Helper()
	gs := grpc.NewServer()
	if s != nil {
		extprocv3.RegisterExternalProcessorServer(gs, s)
	}
	if als != nil {
		accesslogv3.RegisterAccessLogServiceServer(gs, als)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// TestStreamsSpreadOverReplicas: with several hosts in the fusebox cluster,
// each new ext_proc stream goes to the next host (round robin per stream:
// the gRPC async client starts every stream through the cluster's load
// balancer), so consecutive requests — and consecutive attempts of one
// request — land on different replicas; each access log worker's stream
// goes to the host picked when it opens, so a request's entry may reach a
// replica that did not see the request.
func TestStreamsSpreadOverReplicas(t *testing.T) {
	a, b := &scripted{script: plain}, &scripted{script: plain}
	alsA, alsB := &recordingALS{}, &recordingALS{}
	addrA, addrB := startProcessor(t, a, alsA), startProcessor(t, b, alsB)
	r := newRig(t, plain, func(c *Config) {
		c.ExtProc.Addr, c.ExtProc.Addrs = addrA, []string{addrB}
		// Listed the other way round, the access log's hosts are their
		// own cluster (the same hosts in the same order would share the
		// ext_proc streams' rotation, as one Envoy cluster does).
		c.AccessLog = &AccessLogConfig{Addr: addrB, Addrs: []string{addrA}, Workers: 2}
		c.Clusters["default"].Addr = "127.0.0.1:1" // every request is logged (UF)
	})
	for range 4 {
		r.post(`{}`)
	}
	if len(r.proc.requests()) != 0 {
		t.Fatal("a stream went to the rig's own processor, which is not in the cluster")
	}
	streams := func(s *scripted) int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.md)
	}
	if streams(a) != 2 || streams(b) != 2 {
		t.Fatalf("streams per replica: %d and %d, want 2 and 2", streams(a), streams(b))
	}
	waitFor(t, "four entries", func() bool { return len(alsA.got())+len(alsB.got()) == 4 })
	if len(alsA.got()) != 2 || len(alsB.got()) != 2 {
		t.Fatalf("entries per replica: %d and %d (one worker stream to each)", len(alsA.got()), len(alsB.got()))
	}
}

// Routes are matched in order: without the cluster header (fusebox down,
// or no model) a request whose :path has a default route's prefix goes to
// that route's cluster, every other one to the catch-all's.
func TestDefaultRoutesByPrefix(t *testing.T) {
	anth := newUpstream(t, nil)
	r := newRig(t, plain, func(c *Config) {
		c.ExtProc.Addr = "127.0.0.1:1" // fusebox down
		c.ExtProc.FailureModeAllow = true
		c.Clusters["anth"] = &Cluster{Addr: strings.TrimPrefix(anth.srv.URL, "http://")}
		c.DefaultRoutes = []PrefixRoute{{Prefix: "/v1/messages", Cluster: "anth"}}
	})
	post := func(path string) {
		req, _ := http.NewRequest("POST", r.proxy.URL()+path, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post("/v1/messages")
	post("/v1/chat/completions")
	hits := func(u *upstream) int { u.mu.Lock(); defer u.mu.Unlock(); return u.hits }
	if hits(anth) != 1 || hits(r.def) != 1 {
		t.Fatalf("anthropic default %d, catch-all %d: want 1 and 1", hits(anth), hits(r.def))
	}
}

// Dynamic metadata is taken from the reply of every message kind and
// merged into its namespace (StreamInfoImpl::setDynamicMetadata:
// MergeFrom): the decision's fields from the request phase and the
// outcome's from the response phase both reach the access log.
func TestDynamicMetadataMerges(t *testing.T) {
	md := func(kv ...string) *structpb.Struct {
		f := map[string]*structpb.Value{}
		for i := 0; i+1 < len(kv); i += 2 {
			f[kv[i]] = structpb.NewStringValue(kv[i+1])
		}
		return &structpb.Struct{Fields: map[string]*structpb.Value{"fusebox": structpb.NewStructValue(&structpb.Struct{Fields: f})}}
	}
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		resp := plain(req)
		switch {
		case req.GetRequestBody() != nil:
			resp.DynamicMetadata = md("decision", "d-1", "action", "routed")
		case req.GetResponseHeaders() != nil:
			resp.DynamicMetadata = md("outcome", "success", "action", "kept")
		}
		return resp
	})
	r.post(`{}`)
	log := r.proxy.Log()
	got := log[len(log)-1].FuseboxStage()
	if got["decision"] != "d-1" || got["outcome"] != "success" || got["action"] != "kept" {
		t.Fatalf("fusebox namespace %v, want the request's and the response's fields merged", got)
	}
}
