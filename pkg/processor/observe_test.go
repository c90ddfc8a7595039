package processor

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// newObserverEnv is the observer deployment (envoy.observer: true): the
// route role answers the request phases, the observer records (#28).
func newObserverEnv(t *testing.T, opts ...func(*Options)) *env {
	t.Helper()
	return newEnvConfig(t, "envoy: {observer: true}\n"+testConfig, opts...)
}

// fuseboxMetadata is the fusebox namespace a reply set, as Envoy forwards
// it to the observer (metadata_options.forwarding_namespaces).
func fuseboxMetadata(t *testing.T, replies ...*extprocv3.ProcessingResponse) *corev3.Metadata {
	t.Helper()
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for _, r := range replies {
		for ns, v := range r.GetDynamicMetadata().GetFields() {
			if ns != observeNS {
				continue // the observer profile forwards this namespace only
			}
			if md.FilterMetadata[ns] == nil {
				md.FilterMetadata[ns] = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			}
			for k, x := range v.GetStructValue().GetFields() {
				md.FilterMetadata[ns].Fields[k] = x
			}
		}
	}
	return md
}

// observe plays the observer filter: response headers with the forwarded
// metadata, the body, all in observability mode, no reply awaited; then
// the stream's end.
func (e *env) observe(md *corev3.Metadata, status string, chunks ...string) {
	e.t.Helper()
	e.observeCT(md, status, "application/json", chunks...)
}

// observeCT is observe with the response's content type.
func (e *env) observeCT(md *corev3.Metadata, status, ct string, chunks ...string) {
	e.t.Helper()
	e.observeWith(md, []string{":status", status, "content-type", ct}, chunks...)
}

// observeWith is observe with the response's headers.
func (e *env) observeWith(md *corev3.Metadata, headers []string, chunks ...string) {
	e.t.Helper()
	e.observeAttrs(md, attrs(0, "via_upstream"), headers, chunks...)
}

// observeAttrs is observeWith with the response's attributes.
func (e *env) observeAttrs(md *corev3.Metadata, at map[string]*structpb.Struct, headers []string, chunks ...string) {
	e.t.Helper()
	c := e.open("observe")
	send := func(r *extprocv3.ProcessingRequest) {
		r.ObservabilityMode = true
		if err := c.stream.Send(r); err != nil {
			e.t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(headers...), EndOfStream: len(chunks) == 0}},
		Attributes: at})
	for i, ch := range chunks {
		if e.pace > 0 {
			time.Sleep(e.pace) // as an upstream streams them (not a wait for a state)
		}
		send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(ch), EndOfStream: i == len(chunks)-1}}})
	}
	_ = c.stream.CloseSend()
	if _, err := c.stream.Recv(); err == nil {
		e.t.Fatal("the server replied to an observability-mode message")
	}
	c.cancel()
}

// The observer deployment: the route role decides with no response phase
// (its mode override skips them), the observer records the response, once,
// whichever stream ends first; a failure opens the breaker as on the route
// role.
func TestObserverRecordsTheResponse(t *testing.T) {
	for _, order := range []string{"route stream ends first", "observer first"} {
		t.Run(order, func(t *testing.T) {
			e := newObserverEnv(t)
			for range 2 {
				c := e.open("")
				d := c.chat("gpt")
				if d.GetRequestBody() == nil {
					t.Fatalf("no decision: %v", d)
				}
				if mo := d.GetModeOverride(); mo != nil && mo.ResponseHeaderMode != 2 /* SKIP */ {
					t.Fatalf("the route role asks for response phases: %v", mo)
				}
				md := fuseboxMetadata(t, d)
				if md.FilterMetadata[observeNS].GetFields()[observeKey].GetStringValue() == "" {
					t.Fatalf("no observe note in the decision's metadata: %v", md)
				}
				if order == "observer first" {
					e.observe(md, "503", `{"error":{"message":"overloaded"}}`)
					c.end()
				} else {
					c.end()
					e.observe(md, "503", `{"error":{"message":"overloaded"}}`)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for e.status("default", "openai:us:gpt").State != "open" {
				if time.Now().After(deadline) {
					t.Fatalf("two observed 503s did not open the route: %+v", e.status("default", "openai:us:gpt"))
				}
				time.Sleep(5 * time.Millisecond)
			}
			if s := e.status("default", "openai:us:gpt"); s.Failures != 2 {
				t.Fatalf("%d failures recorded, want 2 (each response once)", s.Failures)
			}
		})
	}
}

// A decision the observer never sees (a local reply on Envoy 1.34–1.36) is
// settled as before: a neither after the wait, never a success or a hang.
func TestObserverNeverCameIsANeither(t *testing.T) {
	e := newObserverEnv(t)
	c := e.open("")
	_ = c.chat("gpt")
	c.end()
	e.clk.Advance(3 * time.Second)
	if s := e.status("default", "openai:us:gpt"); s.Failures != 0 || s.State != "closed" {
		t.Fatalf("%+v", s)
	}
}

// The observer without fusebox metadata (not a fusebox decision) records
// nothing and replies nothing.
func TestObserverWithoutADecision(t *testing.T) {
	e := newObserverEnv(t)
	e.observe(&corev3.Metadata{}, "503", "x")
	if s := e.status("default", "openai:us:gpt"); s.Failures != 0 {
		t.Fatalf("%+v", s)
	}
}

// On Envoy 1.37+ fusebox's own immediate replies (a fail-fast 503, a 400)
// pass the encoder chain and reach the observer with no note: there is no
// decision to record, and they are counted as such, apart from a
// deployment that forwards no note. Before, each counted
// observe_no_decision, once per request in an outage; so did Envoy's 413
// for a body over the buffer limit.
func TestObserverSeesFuseboxsOwnReplies(t *testing.T) {
	e := newObserverEnv(t)
	ownReply := func() float64 {
		return testutil.ToFloat64(e.metrics.DecisionEvents.WithLabelValues("observe", "own_reply"))
	}
	noDecision := func() float64 { return testutil.ToFloat64(e.metrics.Refused.WithLabelValues("observe_no_decision")) }
	e.observeAttrs(&corev3.Metadata{}, attrs(0, extproc.DetailsPrefix+extproc.CodeAllOpen), []string{":status", "503", "content-type", "application/json"}, `{"error":{}}`)
	eventually(t, "the own reply counted", func() bool { return ownReply() == 1 })
	if v := noDecision(); v != 0 {
		t.Fatalf("observe_no_decision %v for fusebox's own reply", v)
	}
	// Envoy's own local reply before any decision (the 413 of a body over
	// the buffer limit, sent before the body that names the model): no
	// route was chosen.
	envoyReply := func() float64 {
		return testutil.ToFloat64(e.metrics.DecisionEvents.WithLabelValues("observe", "envoy_reply"))
	}
	e.observeAttrs(&corev3.Metadata{}, attrs(0, "request_payload_too_large"), []string{":status", "413", "content-type", "text/plain"}, "Payload Too Large")
	eventually(t, "Envoy's reply counted", func() bool { return envoyReply() == 1 })
	if v := noDecision(); v != 0 {
		t.Fatalf("observe_no_decision %v for Envoy's 413", v)
	}
	// A response with no note that fusebox did not write still counts.
	e.observe(&corev3.Metadata{}, "200", "x")
	eventually(t, "observe_no_decision counted", func() bool { return noDecision() == 1 })
	if s := e.status("default", "openai:us:gpt"); s.Failures != 0 {
		t.Fatalf("%+v", s)
	}
}

// The observe note round-trips whatever its names hold, and a parse of
// anything else never panics and never yields a half-read note.
func FuzzObserveNote(f *testing.F) {
	f.Add("d1", "gw", "openai:us:gpt", "openai_us", uint64(3), uint64(1), int64(1796000000000000000), "x")
	f.Add("", "a:b", "1:x", "", uint64(0), uint64(0), int64(0), "o1 2:ab")
	f.Fuzz(func(t *testing.T, d, g, r, c string, gen, lease uint64, start int64, junk string) {
		if start < 0 {
			start = -start
		}
		n := observeNote{Decision: d, Parked: lifecycle.Park{Gateway: g, Route: r, Cluster: c, RouteGen: gen, RouteLease: lease, FleetGen: gen / 2, Start: start},
			ReqNs: start / 3, Replica: lease ^ gen}
		got, ok := lifecycle.ParseObserveNote(n.Encode())
		if !ok || got != n {
			t.Fatalf("%+v -> %q -> %+v %v", n, n.Encode(), got, ok)
		}
		if m, ok := lifecycle.ParseObserveNote(junk); ok {
			if again, ok2 := lifecycle.ParseObserveNote(m.Encode()); !ok2 || again != m {
				t.Fatalf("%q parsed to %+v, which does not round-trip", junk, m)
			}
		}
	})
}

// FuzzSealedNotes (R-DL4): what a stream hands another is sealed. A sealed
// observe note or attempt token opens with the fleet's key to what was
// sealed, and with nothing else: another key, the other use, any change of
// a byte, or junk never opens (and never panics).
func FuzzSealedNotes(f *testing.F) {
	f.Add([]byte("o2 note"), "junk", 3)
	f.Add([]byte{}, "", 0)
	f.Add([]byte(`{"v":1}`), "AAAA", 40)
	ours, theirs := lifecycle.NewSealer([]byte("fleet a")), lifecycle.NewSealer([]byte("fleet b"))
	f.Fuzz(func(t *testing.T, plain []byte, junk string, flip int) {
		for _, aad := range [][]byte{lifecycle.ObserveAAD, lifecycle.TokenAAD} {
			sealed := ours.SealFor(aad, plain)
			got, err := ours.OpenFor(aad, sealed)
			if err != nil || string(got) != string(plain) {
				t.Fatalf("round trip: %q -> %q %v", plain, got, err)
			}
			if _, err := theirs.OpenFor(aad, sealed); err == nil {
				t.Fatal("another fleet's key opened it")
			}
			other := lifecycle.TokenAAD
			if string(aad) == string(lifecycle.TokenAAD) {
				other = lifecycle.ObserveAAD
			}
			if _, err := ours.OpenFor(other, sealed); err == nil {
				t.Fatal("sealed for one use, opened for the other")
			}
			b := []byte(sealed)
			i := (flip%len(b) + len(b)) % len(b)
			b[i] ^= 0x01
			if g, err := ours.OpenFor(aad, string(b)); err == nil && string(g) != string(plain) {
				t.Fatalf("a changed byte opened to %q", g)
			}
		}
		if _, err := ours.OpenFor(lifecycle.ObserveAAD, junk); err == nil {
			if _, err2 := ours.OpenFor(lifecycle.TokenAAD, junk); err2 == nil {
				t.Fatal("junk opened for both uses")
			}
		}
	})
}
