package processor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/streamlife"
	"github.com/fusebox-llm/fusebox/pkg/tracing"

	"github.com/fusebox-llm/fusebox/pkg/extproc"

	"github.com/fusebox-llm/fusebox/pkg/grpcwire"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// RoleHeader is the gRPC metadata key Envoy's initial_metadata sets.
const RoleHeader = "x-fusebox-role"

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg   *routes.Holder
	store breaker.Store
	// meet is where the attempts of one request meet, on any replica
	// (meet.go).
	meet *meetings
	// reached: the clusters access log entries have named (reached.go).
	reached reachedClusters
	// labels: broken answers waiting for their entry's label (labelwait.go).
	labels labelWaits
	// timers: every pending call the server armed, ended by Stop
	// (timers.go).
	timers timerSet
	// tracer: nil when tracing is off; traced: the spans waiting for an
	// outcome (trace.go).
	tracer *tracing.Tracer
	traced tracedDecisions
	// tokens seals the hand-offs between streams (lifecycle/seal.go).
	tokens lifecycle.Sealer
	// journal, when set, keeps the recent transitions and what handled
	// the request after each (the dashboard's timeline).
	journal *breaker.Journal
	clock   breaker.Clock
	metrics *metrics.Metrics
	log     *slog.Logger

	comp   atomic.Pointer[compiled] // the installed Runtime's keys
	prev   atomic.Pointer[compiled] // the Runtime it replaced
	compMu sync.Mutex

	// timed reports message durations.
	timed bool
	// phaseObs caches the duration histogram's children: no label lookup
	// per message.
	phaseObs [len(phases)]prometheus.Observer // by phaseIndex
	// testHook runs before each message is handled (tests inject panics).
	testHook func(*extprocv3.ProcessingRequest)
	// finishHook runs before a stream's end is recorded (tests).
	finishHook func()
	// inlineHook runs as the observer judges a chunk inline (tests).
	inlineHook func()
	// entryClaimHook runs once an entry claimed a waiting decision in its
	// note, before it ends the local wait (tests: a recheck in between).
	entryClaimHook func()

	maxStreams int64
	streams    atomic.Int64
	// streamIdle and streamMax bound a stream's life (R-L13); 0 = none.
	streamIdle, streamMax time.Duration
	// lives is the streams whose bounds the sweep checks (sweep.go).
	lives streamlife.Sweep
	// bounds are the streams' lifetime bounds (R-L13), made once in
	// NewServer: a closure per stream would be an allocation each.
	bounds streamlife.Bounds
	// The access log channel (accesslog.go): the decisions it can still
	// speak for, the Envoy streams connected, and who hears of them.
	decisions          *decisionTable
	held               heldCount
	alStreams          atomic.Int64
	onAccessLogStreams func(n int64)
	history            *breaker.History
	// faults is this replica's ledger of request faults (requestfault.go).
	faults *faultLedger
	// storeInProcess: the store's calls cannot stall (breaker.IsInProcess).
	storeInProcess bool
	stalls         stallWatch
	baselines      *judge.Baselines
	// tooLargeLogged limits the message_too_large log to one line a minute.
	tooLargeLogged atomic.Int64
	mism           mismatches
	// entryWorkers bounds the access log entries settled at once.
	entryWorkers chan struct{}
	// replica names this process in the notes it writes (R-DL6: whether a
	// time another stream measured is on this clock).
	replica    uint64
	onMismatch func(what, help string)
	// replicaName names this replica in the access log line (R-FD5:
	// replay counts a quorum of replicas by it), as the store names it.
	replicaName *structpb.Value
}

// Options configure a Server.
type Options struct {
	Config  *routes.Holder
	Store   breaker.Store
	Clock   breaker.Clock
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// MaxStreams bounds the streams served at once (R-L6); 0 = no bound.
	MaxStreams int
	// StreamIdle ends a stream with no message for this long, and
	// StreamDuration one older than this (R-L13); 0 = no bound.
	StreamIdle, StreamDuration time.Duration
	// OnAccessLogStreams hears how many access log streams are connected
	// (R-AL6: /readyz says whether one is).
	OnAccessLogStreams func(n int64)
	// Journal, when set, hears what handled each request after a
	// transition (R-API7).
	Journal *breaker.Journal
	// Replica names this replica in the access log line (fusebox.replica,
	// R-FD5), the name the store gives it (redisstore.Options.ReplicaID);
	// "" = a random one.
	Replica string
	// TokenKey keys the attempt token's seal (R-X10). Every replica of a
	// fleet must have the same one; empty = a random key (one process).
	TokenKey []byte
	// History, when set, keeps each route's recent outcomes for the
	// dashboard's sparklines.
	History *breaker.History
	// OnMismatch hears of a deployment mismatch (R-DL10), at most once a
	// minute per kind: /readyz shows it.
	OnMismatch func(what, help string)
	// MaxHeld bounds the decisions held in memory while they wait in their
	// note, and the attempts parked here (held.go); 0 = heldBound().
	MaxHeld int
	// Tracer makes the decisions' spans (SPEC §17); nil = tracing off.
	Tracer *tracing.Tracer
}

// NewServer returns the ext_proc service.
func NewServer(o Options) *Server {
	if o.Clock == nil {
		o.Clock = breaker.SystemClock{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New()
	}
	s := &Server{cfg: o.Config, store: o.Store, clock: o.Clock, metrics: o.Metrics, log: o.Log, timed: true,
		maxStreams: int64(o.MaxStreams), history: o.History, baselines: judge.NewBaselines(),
		streamIdle: o.StreamIdle, streamMax: o.StreamDuration,
		decisions: newDecisionTable(), onAccessLogStreams: o.OnAccessLogStreams, onMismatch: o.OnMismatch, tracer: o.Tracer}
	s.held.max = int64(o.MaxHeld)
	if s.held.max <= 0 {
		s.held.max = heldBound()
	}
	s.meet = newMeetings(s)
	s.bounds = streamlife.Bounds{Idle: s.streamIdle, Max: s.streamMax,
		Refused: func(what string) { s.metrics.Refused.WithLabelValues(what).Inc() }}
	s.meet.max = int(min(s.held.max, 10000))
	if o.MaxHeld > 0 {
		s.meet.max = o.MaxHeld
	}
	s.entryWorkers = make(chan struct{}, maxEntryWorkers)
	s.replica = mrand.Uint64() | 1
	name := o.Replica
	if name == "" {
		name = strconv.FormatUint(s.replica, 16)
	}
	s.replicaName = structpb.NewStringValue(name)
	s.tokens = lifecycle.NewSealer(o.TokenKey)
	s.faults = newFaultLedger(o.TokenKey)
	s.storeInProcess = breaker.IsInProcess(o.Store)

	s.journal = o.Journal
	// Registered once per registry: a second Server on the same metrics
	// (tests) shares the first's gauge.
	_ = o.Metrics.Registry.Register(rampCollector{s})
	for i, ph := range phases {
		s.phaseObs[i] = o.Metrics.MessageDuration.WithLabelValues(ph)
	}
	o.Config.OnSwap(s.install)
	return s
}

// Process serves one ext_proc stream (one HTTP request), within the stream
// lifetime bounds (lifetime.go).
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return s.bounded(stream.Context(), func(act *streamlife.Activity) error { return s.serve(stream, act) })
}

// bounded runs one stream of either service (ext_proc, access log): it
// counts against limits.max_concurrent_streams and is ended at the stream
// lifetime bounds (R-L13); act, when set, hears of each message.
func (s *Server) bounded(ctx context.Context, run func(act *streamlife.Activity) error) error {
	if n := s.streams.Add(1); s.maxStreams > 0 && n > s.maxStreams {
		s.streams.Add(-1)
		s.metrics.Refused.WithLabelValues(metrics.RefusedStreamLimit).Inc()
		return status.Errorf(codes.ResourceExhausted, "fusebox serves at most %d streams at once (limits.max_concurrent_streams)", s.maxStreams)
	}
	if s.streamIdle <= 0 && s.streamMax <= 0 {
		defer s.streams.Add(-1)
		return run(nil)
	}
	act := &streamlife.Activity{}
	if end := grpcwire.EndFunc(ctx); end != nil { // fusebox's own transport
		defer s.streams.Add(-1)
		return s.lives.Run(s.bounds, end, run, act)
	}
	done := make(chan error, 1)
	// On a reused goroutine: a new one's stack growth was a sixteenth of
	// the observer's CPU (pprof under make bench-wire).
	grpcwire.Go(func() {
		// The stream counts against the limit until its goroutine ends.
		defer s.streams.Add(-1)
		done <- run(act)
	})
	return streamlife.Watch(s.bounds, done, act)
}

// serve reads and answers the stream's messages until it ends; act, when
// set, hears of each message.
func (s *Server) serve(stream extprocv3.ExternalProcessor_ProcessServer, act *streamlife.Activity) error {
	role := s.role(stream)
	if role == roleOther {
		return s.recvErr(passThrough(stream, act))
	}
	s.metrics.StreamsActive.Inc()
	defer s.metrics.StreamsActive.Dec()
	var st roleStream
	switch env := s.cfg.Load().Envoy; role {
	case roleRoute:
		rs := newStream(s)
		if s.tracer != nil {
			rs.traceParent = s.tracer.Parent(stream.Context())
		}
		st = rs
	case roleAttempt:
		if !env.Failover {
			s.mismatch(MismatchAttempt)
		}
		a := newAttemptStream(s)
		if s.tracer != nil {
			a.j.traceParent = s.tracer.Parent(stream.Context())
		}
		st = a
	case roleObserve:
		o := newObserverStream(s)
		if s.tracer != nil {
			o.traceParent = s.tracer.Parent(stream.Context())
		}
		if !env.Observer {
			// Not deployed: what it says is recorded nowhere (a forged
			// or misrouted observer must not steer a breaker).
			s.mismatch(MismatchObserver)
			o.done = true
		}
		st = o
	}
	defer s.finish(st)
	// The observer's stream decodes every message into one (its 50
	// chunks per response are most of its cost): nothing an observer
	// handles keeps the message or its body (decodeBodyMessage). The other
	// roles get a new message each time.
	var reuse *extprocv3.ProcessingRequest
	if role == roleObserve {
		reuse = new(extprocv3.ProcessingRequest)
		s.observeInline(stream, st.(*observerStream), act)
	}
	for {
		req, err := recvInto(stream, reuse)
		if act != nil {
			act.Touch()
		}
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return s.recvErr(err)
		}
		resp := s.handle(st, req)
		if e, ok := st.(ender); ok && e.over() {
			// The observer recorded its response: its stream ends here
			// rather than at Envoy's deferred close, seconds later.
			return nil
		}
		if resp == nil {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// handle answers one message. A panic never reaches Envoy (R-D7): it is
// recovered, counted, and answered with the first candidate when one is
// known, otherwise with a pass-through reply of the right kind.
func (s *Server) handle(st roleStream, req *extprocv3.ProcessingRequest) (resp *extprocv3.ProcessingResponse) {
	var t0 time.Duration
	if s.timed {
		t0 = time.Since(monoStart)
	}
	defer func() {
		if p := recover(); p != nil {
			s.metrics.InternalErrors.WithLabelValues("panic").Inc()
			s.log.Error("recovered a panic while processing; the request continues", "panic", p, "stack", string(debug.Stack()))
			resp = st.fallback(req)
		}
		if s.timed {
			s.phaseObs[phaseIndex(req)].Observe((time.Since(monoStart) - t0).Seconds())
		}
	}()
	if s.testHook != nil {
		s.testHook(req)
	}
	return st.handle(req)
}

// recvErr counts and logs a message that was over the size limit (R-L1):
// gRPC refuses it before fusebox sees it, and Envoy then lets the request
// through unprocessed (failure_mode_allow), so it must never be silent.
func (s *Server) recvErr(err error) error {
	if status.Code(err) == codes.ResourceExhausted {
		s.metrics.Refused.WithLabelValues(metrics.RefusedMessageTooLarge).Inc()
		now := time.Now().Unix()
		if last := s.tooLargeLogged.Load(); now-last >= 60 && s.tooLargeLogged.CompareAndSwap(last, now) {
			s.log.Error("an ext_proc message was over limits.max_message_bytes: the request went on without fusebox (counted in fusebox_refused_total{what=\"message_too_large\"}); raise the limit above Envoy's buffer", "error", err.Error())
		}
	}
	return err
}

// finish ends a stream. Recording at the stream's end runs under the same
// recover as every message (R-D7): a panic there is counted, never fatal.
func (s *Server) finish(st roleStream) {
	defer func() {
		if p := recover(); p != nil {
			s.metrics.InternalErrors.WithLabelValues("panic").Inc()
			s.log.Error("recovered a panic while ending a stream", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	if s.finishHook != nil {
		s.finishHook()
	}
	st.finish()
}

// phases are the message phases, the duration histogram's labels, in
// phaseIndex's order.
var phases = [...]string{"request_headers", "request_body", "request_trailers", "response_headers", "response_body", "response_trailers", "other"}

func phaseOf(req *extprocv3.ProcessingRequest) string { return phases[phaseIndex(req)] }

func phaseIndex(req *extprocv3.ProcessingRequest) int {
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return 0
	case *extprocv3.ProcessingRequest_RequestBody:
		return 1
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return 2
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return 3
	case *extprocv3.ProcessingRequest_ResponseBody:
		return 4
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return 5
	}
	return 6
}

// monoStart anchors handle's clock: time.Since reads the monotonic clock
// alone, where time.Now reads the wall clock too, twice per message.
var monoStart = time.Now()

// The roles a stream plays, from x-fusebox-role in its gRPC metadata.
const (
	roleRoute = iota
	roleAttempt
	roleObserve
	roleOther
)

// role reads x-fusebox-role: absent or "route" is the route role (the
// decision); "attempt" the attempt role in a provider cluster's upstream
// chain (SPEC §11); "observe" the observer role in observability mode
// (observe.go); anything else gets CONTINUE replies and records nothing.
func (s *Server) role(stream extprocv3.ExternalProcessor_ProcessServer) int {
	// ValueFromIncomingContext copies one key's values, where
	// FromIncomingContext copied the stream's whole metadata (a map and
	// every value, per stream).
	v := metadata.ValueFromIncomingContext(stream.Context(), RoleHeader)
	switch {
	case len(v) == 0 || v[0] == "route" || v[0] == "":
		return roleRoute
	case v[0] == "attempt":
		return roleAttempt
	case v[0] == "observe":
		return roleObserve
	}
	return roleOther
}

// recvInto receives the next message, into m when m is set.
func recvInto(stream extprocv3.ExternalProcessor_ProcessServer, m *extprocv3.ProcessingRequest) (*extprocv3.ProcessingRequest, error) {
	if m == nil {
		return stream.Recv()
	}
	if err := stream.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

func passThrough(stream extprocv3.ExternalProcessor_ProcessServer, act *streamlife.Activity) error {
	for {
		req, err := stream.Recv()
		if act != nil {
			act.Touch()
		}
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if resp := extproc.ContinueReply(req); resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// compiled holds the breaker keys of one Runtime, so a decision looks up
// no map keyed by strings. Keys stay valid across reloads for breakers that
// stay configured (R-P9).
type compiled struct {
	rt      *routes.Runtime
	targets map[*routes.Route]*breaker.Target
	// bases are the latency baselines of routes with
	// slow_call_baseline_multiplier (R-T6), looked up once here.
	bases map[*routes.Route]*judge.Baseline
}

// install puts rt's breakers and policies into the store (R-P9, R-P11). It
// runs before rt is published (Holder.OnSwap): every configured breaker
// exists, with its state series, before any request sees the config; a
// removed one loses its breaker and its series.
func (s *Server) install(rt *routes.Runtime) {
	ctx := context.Background()
	now := s.clock.Now().UnixNano()
	var specs []breaker.Spec
	type ref struct {
		r   *routes.Route
		gw  string
		idx int
	}
	var refs []ref
	for _, id := range rt.GatewayIDs {
		g := rt.Gateways[id]
		for _, r := range g.RouteList {
			refs = append(refs, ref{r, g.ID, len(specs)})
			specs = append(specs, breaker.Spec{ID: breaker.RouteID(g.ID, r.Key), Policy: r.Policy})
		}
	}
	fleetAt := map[string]int{}
	for _, name := range rt.FleetNames {
		fleetAt[name] = len(specs)
		specs = append(specs, breaker.Spec{ID: breaker.FleetID(name), Policy: rt.Fleets[name].Policy})
	}
	keys, removed, err := s.store.Install(ctx, now, specs)
	if err != nil {
		// A shared store that is down: decisions go on with keys resolved
		// by ID (R-ST4); the store catches up when it returns.
		s.metrics.StoreErrors.WithLabelValues("install").Inc()
		s.log.Error("installing the config's breakers failed; deciding on local state", "error", err)
		keys = make([]breaker.Key, len(specs))
		for i, sp := range specs {
			keys[i] = breaker.KeyOf(sp.ID)
		}
	}
	c := &compiled{rt: rt, targets: make(map[*routes.Route]*breaker.Target, len(refs)), bases: map[*routes.Route]*judge.Baseline{}}
	for _, rf := range refs {
		t := &breaker.Target{Route: keys[rf.idx]}
		if rf.r.Policy.BaselineMultiplier > 0 {
			c.bases[rf.r] = s.baselines.Get(specs[rf.idx].ID)
		}
		if rf.r.Fleet != nil {
			t.Fleet, t.HasFleet = keys[fleetAt[rf.r.Fleet.Name]], true
		}
		c.targets[rf.r] = t
	}
	for i, sp := range specs {
		s.publishState(ctx, keys[i], sp.ID, now)
	}
	s.publishModes(specs)
	for _, id := range removed {
		s.metrics.State.DeleteLabelValues(id.Gateway, id.Route, id.Provider(), string(id.Scope))
		for _, kind := range []string{"requests", "tokens"} {
			s.metrics.RouteHeadroom.DeleteLabelValues(id.Gateway, id.Route, kind)
		}
	}
	if len(removed) > 0 {
		keep := make(map[breaker.ID]bool, len(specs))
		for _, sp := range specs {
			keep[sp.ID] = true
		}
		s.history.Retain(keep)
		s.baselines.Retain(keep)
	}
	s.compMu.Lock()
	s.prev.Store(s.comp.Load())
	s.comp.Store(c)
	s.compMu.Unlock()
}

// publishModes sets fusebox_breaker_mode to the installed breakers' modes,
// alone: a mode a reload changed, or a breaker it removed, leaves no
// series behind.
func (s *Server) publishModes(specs []breaker.Spec) {
	s.metrics.BreakerMode.Reset()
	for _, sp := range specs {
		mode, on := string(breaker.ModeOff), 0.0
		if sp.Policy != nil {
			mode = string(sp.Policy.Mode)
			if sp.Policy.Active() {
				on = 1
			}
		}
		s.metrics.BreakerMode.WithLabelValues(sp.ID.Gateway, sp.ID.Route, string(sp.ID.Scope), mode).Set(on)
	}
}

// compiledFor returns the keys of rt: the installed config's, the one it
// replaced (streams that began before a reload), or, for anything older,
// keys resolved by ID. It never publishes anything: only install does.
func (s *Server) compiledFor(rt *routes.Runtime) *compiled {
	if c := s.comp.Load(); c != nil && c.rt == rt {
		return c
	}
	if c := s.prev.Load(); c != nil && c.rt == rt {
		return c
	}
	c := &compiled{rt: rt, targets: map[*routes.Route]*breaker.Target{}, bases: map[*routes.Route]*judge.Baseline{}}
	for _, g := range rt.Gateways {
		for _, r := range g.RouteList {
			t := &breaker.Target{Route: breaker.KeyOf(breaker.RouteID(g.ID, r.Key))}
			if r.Policy.BaselineMultiplier > 0 {
				c.bases[r] = s.baselines.Get(breaker.RouteID(g.ID, r.Key))
			}
			if r.Fleet != nil {
				t.Fleet, t.HasFleet = breaker.KeyOf(breaker.FleetID(r.Fleet.Name)), true
			}
			c.targets[r] = t
		}
	}
	return c
}

// publishState sets the state gauge of a breaker from its current state.
//
// It reads the local state (Peek): an install runs inside the shared
// store's feed reader when an overlay changes, and a remote call per
// breaker there would stall the feed for N round trips (a fleet's view is
// kept current by the store itself).
func (s *Server) publishState(ctx context.Context, k breaker.Key, id breaker.ID, now int64) {
	s.metrics.State.WithLabelValues(id.Gateway, id.Route, id.Provider(), string(id.Scope)).Set(float64(s.store.Peek(ctx, k, now).State))
}

// LatencyBaselineMs is a route's latency baseline (R-T6) at now, 0 when it
// has none: what the routes API shows.
func (s *Server) LatencyBaselineMs(id breaker.ID, now int64) int64 { return s.baselines.P50(id, now) }
