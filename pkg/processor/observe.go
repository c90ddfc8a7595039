package processor

import (
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/streamlife"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
	"go.opentelemetry.io/otel/trace"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/grpcwire"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// The observer role (#28; envoy/envoy-observer.yaml, envoy.observer): a
// second ext_proc filter in observability mode sends fusebox the response
// headers and the STREAMED body without pausing the filter chain, and
// ignores every reply (docs/envoy.md, "Observability mode"). No chunk of a
// response waits for fusebox, so a GC pause or a CPU-starved pod never
// delays a token. The route role answers the request phases only; the
// observer judges the response with the same component the route role used
// (response.go) and records it.
//
// The observer learns the decision from dynamic metadata: the route role
// writes, in namespace fusebox.observe, the decision id and what recording
// needs (gateway, route, admission, start); the observer filter forwards
// that namespace (metadata_options.forwarding_namespaces). Its stream may reach
// another replica than the route role's, so the two meet in the decision's
// note (meet.go): the route role's stream ends with no response and parks
// the decision there (as it waits for an access log entry); the observer
// claims it, or marks it first, and records; a park or an entry after the
// observer records nothing. When no observer stream comes (a local reply
// on Envoy 1.34–1.36, which observability mode is not shown either), the
// access log entry or the park's end settles it, as before.

// observeNS is the metadata namespace the route role writes for the
// observer, apart from fusebox's own so that the access log line (which
// logs %DYNAMIC_METADATA(fusebox)%) does not carry it; observeKey its field.
const (
	observeNS  = "fusebox.observe"
	observeKey = "note"
)

// observeNote is what the route role writes in fusebox.observe: the
// decision as a parked note (N 0), so that recording on the observer's
// replica is the same rebuild as recording a parked decision.
//
// It is sealed (R-DL4) with the fleet's key, as the attempt token is:
// whoever reaches the ext_proc port cannot make one up, and one that is
// replayed finds its decision observed already (the note's table) or is
// older than decision_wait_sec.
func (st *stream) observeNote() string {
	n := observeNote{Decision: st.decisionID, Parked: lifecycle.Park{Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
		RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease, Start: st.startNs},
		ReqNs: max(st.now()-st.startNs, 0), Replica: st.s.replica}
	var buf [192]byte
	return st.s.tokens.SealFor(lifecycle.ObserveAAD, n.AppendTo(buf[:0]))
}

// The observe note is the lifecycle's hand-off (lifecycle/handoff.go).
type observeNote = lifecycle.ObserveNote

// withObserve adds the observer's note to the decision's metadata, and the
// chosen route to the fusebox namespace: with no response phase the route
// role cannot set x-fusebox-route on the response, so the observer
// profile's route config adds it from %DYNAMIC_METADATA(fusebox:route)%.
func withObserve(stage *structpb.Struct, route, note string) *structpb.Struct {
	stage.Fields["fusebox"].GetStructValue().Fields["route"] = structpb.NewStringValue(route)
	stage.Fields[observeNS] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
		observeKey: structpb.NewStringValue(note)}})
	return stage
}

// observerStream is the observer role's stream: one response, observed.
type observerStream struct {
	s *Server
	// traceParent: the context Envoy sent on the observer's stream (the
	// request's trace), for an outcome whose decision span another
	// replica holds.
	traceParent trace.SpanContext
	j           *stream // the judging component, once the decision is known
	// done: the stream names no decision fusebox can record (no fusebox
	// metadata, a route since removed, an untracked route): the rest is
	// read and dropped.
	done bool
	eos  bool // the response's last message was seen
}

func newObserverStream(s *Server) *observerStream { return &observerStream{s: s} }

// handle judges one observed message. Envoy ignores any reply in
// observability mode, so none is sent: nil.
func (o *observerStream) handle(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if !o.done && o.j == nil && req.GetResponseHeaders() != nil {
		if o.j = o.begin(req); o.j == nil {
			o.done = true
		} else {
			o.j.traceChannel = tracing.ChannelObserver
			o.j.traceParent = o.traceParent
		}
	}
	if o.j != nil && !o.done {
		_ = o.j.judgeResponse(req)
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		o.eos = r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		o.eos = r.ResponseBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		o.eos = true
	}
	return nil
}

// begin reads the decision from the forwarded metadata and claims it in its
// note; nil when there is nothing to record.
func (o *observerStream) begin(req *extprocv3.ProcessingRequest) *stream {
	s := o.s
	raw := req.GetMetadataContext().GetFilterMetadata()[observeNS].GetFields()[observeKey].GetStringValue()
	if raw == "" {
		// fusebox's own immediate replies (a fail-fast 503, a 400) pass
		// the encoder chain on Envoy 1.37+ and reach the observer with no
		// note: no decision to record (R-OB, #52). Anything else with no
		// note is a deployment that does not forward it.
		_, _, details, _ := extproc.Attributes(req.GetAttributes())
		switch {
		case strings.HasPrefix(details, extproc.DetailsPrefix):
			s.metrics.DecisionEvents.WithLabelValues("observe", "own_reply").Inc()
			return nil
		case details != "" && details != "via_upstream":
			// One of Envoy's own local replies sent before the route
			// role decided (a 413 for a body over the buffer limit comes
			// after the request headers, before the body that names the
			// model): no route was chosen, nothing to record.
			s.metrics.DecisionEvents.WithLabelValues("observe", "envoy_reply").Inc()
			return nil
		}
		s.metrics.Refused.WithLabelValues("observe_no_decision").Inc()
		return nil
	}
	first := s.clock.Now().UnixNano()
	var n observeNote
	plain, err := s.tokens.OpenFor(lifecycle.ObserveAAD, raw)
	ok := err == nil
	if ok {
		n, ok = lifecycle.ParseObserveNote(string(plain))
	}
	if !ok || n.Decision == "" || len(n.Decision) > 64 {
		// Not sealed by this fleet: forged, or from another one.
		s.metrics.DecisionEvents.WithLabelValues("observe", "forged").Inc()
		return nil
	}
	if first-n.Parked.Start > int64(s.cfg.Load().DecisionWait)+int64(time.Minute) {
		// Older than any decision still waits: a replay.
		s.metrics.DecisionEvents.WithLabelValues("observe", "duplicate").Inc()
		return nil
	}
	id := n.Decision
	st := s.streamFromNote(id, &n.Parked)
	if st == nil || !st.tracked {
		return nil
	}
	// One clock per measurement (R-DL6): the route role's start where it
	// is this process's own, else this stream's first message less the
	// request phase the route role measured.
	if n.Replica != s.replica {
		st.startNs = first - n.ReqNs
	}
	switch act := s.meet.notes.Run(id, nil, lifecycle.Op{Observe: true}); act.How {
	case lifecycle.HowObserved:
		if act.Late {
			st.adm.Route.Lease, st.adm.Fleet.Lease = 0, 0
		}
		s.observedHere(id)
	case lifecycle.HowObserveFirst, lifecycle.HowUnreachable:
		// Ours to record (a meeting place that did not answer: the real
		// outcome is recorded here, R-DL7).
	default:
		return nil
	}
	return st
}

// ender is a stream that knows it is over before Envoy closes it.
type ender interface{ over() bool }

// over: the response was recorded at its end (or there is nothing to
// record and the message was the last one).
func (o *observerStream) over() bool {
	return o.eos && (o.j == nil || o.j.recorded || o.done)
}

func (o *observerStream) fallback(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	return nil
}

// finish records what the response showed by its end: the judging
// component's own end of stream (a response that did not complete is a
// neither, as on the route role).
func (o *observerStream) finish() {
	if o.j != nil {
		o.j.finish()
	}
}

// observedHere ends the wait of a decision parked on this replica that the
// observer just claimed: its timer would only find the note claimed.
func (s *Server) observedHere(id string) {
	p := s.decisions.get(id)
	if p == nil {
		return
	}
	if _, settled := p.step(lifecycle.WClaim, lifecycle.HowObserved); settled {
		s.forgetDecision(id, true, true)
	}
}

// observeInline has fusebox's transport hand the observer's chunks to it
// on the connection's reader (grpcwire.SetInline) while its stream waits:
// the chunks are one-way, judging one is short and never records, and
// handed to the stream's goroutine each batch was a wake-up, a copy out of
// the frame and a cold cache (make bench-wire -compare). A message it does
// not take (the response's last one, one that may record, anything but a
// chunk) goes to the stream's goroutine, in order, as before. On grpc-go's
// server nothing changes.
func (s *Server) observeInline(stream extprocv3.ExternalProcessor_ProcessServer, o *observerStream, act *streamlife.Activity) {
	// Its own message: the stream's goroutine keeps decoding into its own
	// reused one, and the two never run at once.
	req := new(extprocv3.ProcessingRequest)
	grpcwire.SetInline(stream.Context(), func(b []byte) bool {
		// The body points into the frame (valid during this call), as it
		// points into the transport's buffer on the stream's goroutine.
		if !extproc.DecodeBodyMessage(b, req, true) {
			return false
		}
		rb, ok := req.Request.(*extprocv3.ProcessingRequest_ResponseBody)
		if !ok || rb.ResponseBody.GetEndOfStream() || !o.inlineable() {
			return false
		}
		if act != nil {
			act.Touch()
		}
		if s.inlineHook != nil {
			s.inlineHook()
		}
		s.handle(o, req)
		return true
	})
}

// inlineable: a chunk (not the last) changes nothing but the classifier
// and the stall watch, records nothing, and may be judged on the reader.
// A sniffed body records once its sniff is full.
func (o *observerStream) inlineable() bool {
	j := o.j
	return j == nil || o.done || !j.tracked || j.recorded || !j.respStarted || j.wait != judge.NeedSniff
}
