package grpcwire

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/summerwind/h2spec/config"
	"github.com/summerwind/h2spec/generic"
	"github.com/summerwind/h2spec/hpack"
	h2http2 "github.com/summerwind/h2spec/http2"
	"github.com/summerwind/h2spec/spec"
	"google.golang.org/grpc"
)

// Conformance (#50): h2spec 2.2.1 (a conformance suite nobody here wrote,
// pinned in go.mod) runs its generic, http2 and hpack groups against both
// transports of the ext_proc listener. grpcwire's expected failures are
// listed with the reason a gRPC server is allowed them; the list may only
// shrink: a case that fails and is not listed fails the test (a
// regression), and a listed case that passes fails it too (take it off).
// h2spec's cases are written for RFC 7540 and a general HTTP/2 server:
// a gRPC server answers its plain requests with 415, and RFC 9113 relaxed
// several of the rules it checks.

// h2specAllowed are the reasons, by case, shared by both transports.
var h2specAllowed = map[string]string{
	"generic/2/2": "h2spec wants a DATA frame in answer to its plain GET; a gRPC server answers a request that is not gRPC with 415 and no body",
	"generic/2/3": "as generic/2/2",
	"http2/5.1.2/1": "a stream past SETTINGS_MAX_CONCURRENT_STREAMS is refused with REFUSED_STREAM, which RFC 9113 §5.1.2 allows " +
		"(RFC 7540's PROTOCOL_ERROR is what h2spec wants); a refused stream is safe for Envoy to retry",
	"http2/5.1/5":   "DATA after the peer's END_STREAM on a stream the server still serves resets that stream (STREAM_CLOSED as a stream error), not the connection",
	"http2/5.1/8":   "DATA for a stream the server reset is dropped: the peer's DATA in flight races with the reset (RFC 9113 §5.1, closed: frames after RST_STREAM may be ignored)",
	"http2/5.1/11":  "as http2/5.1/8, for a stream that ended",
	"http2/6.1/2":   "as http2/5.1/8",
	"http2/5.3.1/1": "priority signals are ignored: RFC 9113 §5.3.2 deprecates the priority scheme, and a self-dependency is no longer an error to check",
	"http2/5.3.1/2": "as http2/5.3.1/1",
	"http2/6.9.1/3": "h2spec's request is a plain GET, which a gRPC server answers 415 and closes at once; its WINDOW_UPDATEs then name a closed stream, " +
		"which RFC 9113 §6.9 lets an endpoint ignore. On a gRPC stream the overflow resets it with FLOW_CONTROL_ERROR (TestRFC9113FlowAndIdleErrors)",
	"http2/8.1.2.2/2": "a malformed request (here a TE other than trailers) is answered with an HTTP or gRPC status on its stream, never handed to a handler; " +
		"h2spec wants a stream PROTOCOL_ERROR; Envoy's codec never sends one",
	"http2/8.1.2.3/1": "as http2/8.1.2.2/2 (an empty :path)",
	"http2/8.1.2.3/2": "as http2/8.1.2.2/2 (no :method)",
	"http2/8.1.2.3/3": "as http2/8.1.2.2/2 (no :scheme)",
	"http2/8.1.2.3/4": "as http2/8.1.2.2/2 (no :path)",
	"http2/8.1.2.6/1": "as http2/8.1.2.2/2 (a content-length that the DATA does not match: gRPC frames its own messages)",
	"http2/8.1.2.6/2": "as http2/8.1.2.6/1",
}

// grpcwireOnly: what grpcwire alone is allowed.
var grpcwireOnly = map[string]string{
	"http2/8.1.2.2/1": "a connection-specific header field is answered like any malformed request (http2/8.1.2.2/2)",
}

// grpc-go is the reference, not the subject: upstream maintains it, and
// against h2spec's waits its results vary from run to run (28 or 29
// failures here, among them some of http2/5.1 and 6.2 in one run and not
// the next). Its run is logged, with what it fails that grpcwire passes,
// and holds nothing.

// runH2spec runs h2spec's generic, http2 and hpack groups against addr and
// returns the IDs ("http2/6.9.1/2") of the cases that failed, with why,
// and how many ran.
func runH2spec(t *testing.T, addr string) (failed map[string]string, ran int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	c := &config.Config{Host: host, Port: p, Path: processPath, Timeout: 1500 * time.Millisecond, MaxHeaderLen: 4000}
	failed = map[string]string{}
	var walk func(g *spec.TestGroup)
	walk = func(g *spec.TestGroup) {
		for i, tc := range g.Tests {
			if tc.Result == nil {
				continue
			}
			ran++
			if tc.Result.Failed {
				failed[fmt.Sprintf("%s/%d", g.ID(), i+1)] = fmt.Sprintf("%s: %s: %v", g.Name, tc.Desc, tc.Result.Error)
			}
		}
		for _, sub := range g.Groups {
			walk(sub)
		}
	}
	for _, g := range []*spec.TestGroup{generic.Spec(), h2http2.Spec(), hpack.Spec()} {
		g.Test(c)
		walk(g)
	}
	return failed, ran
}

func TestH2spec(t *testing.T) {
	if testing.Short() {
		t.Skip("h2spec takes about 25 s a transport (its waits)")
	}
	for _, tc := range []struct {
		name   string
		addr   func(t *testing.T) string
		only   map[string]string
		strict bool
	}{
		{"grpcwire", func(t *testing.T) string { return serve(t, Options{MaxConcurrentStreams: 100}, echo).addr }, grpcwireOnly, true},
		{"grpc-go", func(t *testing.T) string {
			gs := grpc.NewServer(grpc.MaxConcurrentStreams(100))
			extprocv3.RegisterExternalProcessorServer(gs, proc{fn: echo})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go gs.Serve(ln)
			t.Cleanup(gs.Stop)
			return ln.Addr().String()
		}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not in parallel: h2spec keeps its log's state in globals.
			failed, ran := runH2spec(t, tc.addr(t))
			allowed := func(id string) bool { _, a := h2specAllowed[id]; _, b := tc.only[id]; return a || b }
			var ids []string
			for id := range failed {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			t.Logf("%s: %d of %d h2spec cases pass", tc.name, ran-len(failed), ran)
			if !tc.strict {
				for _, id := range ids {
					if !allowed(id) {
						t.Logf("%s fails here, and passes on grpcwire: %s", id, failed[id])
					}
				}
				return
			}
			for _, id := range ids {
				if !allowed(id) {
					t.Errorf("%s fails and is not an expected failure: %s", id, failed[id])
				}
			}
			for _, list := range []map[string]string{h2specAllowed, tc.only} {
				for id := range list {
					if _, f := failed[id]; !f {
						t.Errorf("%s passes now: take it off the expected failures", id)
					}
				}
			}
		})
	}
}
