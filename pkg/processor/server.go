package processor

import (
	"errors"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// RoleHeader is the gRPC metadata key Envoy's initial_metadata sets.
const RoleHeader = "x-fusebox-role"

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     *routes.Holder
	store   breaker.Store
	clock   breaker.Clock
	metrics *metrics.Metrics
	log     *slog.Logger

	comp   atomic.Pointer[compiled]
	compMu sync.Mutex

	// timed reports message durations.
	timed bool
	// phaseObs caches the duration histogram's children: no label lookup
	// per message.
	phaseObs map[string]prometheus.Observer
	// testHook runs before each message is handled (tests inject panics).
	testHook func(*extprocv3.ProcessingRequest)
}

// Options configure a Server.
type Options struct {
	Config  *routes.Holder
	Store   breaker.Store
	Clock   breaker.Clock
	Metrics *metrics.Metrics
	Log     *slog.Logger
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
	s := &Server{cfg: o.Config, store: o.Store, clock: o.Clock, metrics: o.Metrics, log: o.Log, timed: true, phaseObs: map[string]prometheus.Observer{}}
	for _, ph := range []string{"request_headers", "request_body", "request_trailers", "response_headers", "response_body", "response_trailers", "other"} {
		s.phaseObs[ph] = o.Metrics.MessageDuration.WithLabelValues(ph)
	}
	return s
}

// Process serves one ext_proc stream (one HTTP request).
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	if !s.isRouteRole(stream) {
		return passThrough(stream)
	}
	s.metrics.StreamsActive.Inc()
	defer s.metrics.StreamsActive.Dec()
	st := newStream(s)
	defer st.finish()
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		resp := s.handle(st, req)
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
func (s *Server) handle(st *stream, req *extprocv3.ProcessingRequest) (resp *extprocv3.ProcessingResponse) {
	var t0 time.Time
	if s.timed {
		t0 = time.Now()
	}
	defer func() {
		if p := recover(); p != nil {
			s.metrics.InternalErrors.WithLabelValues("panic").Inc()
			s.log.Error("recovered a panic while processing; the request continues", "panic", p, "stack", string(debug.Stack()))
			resp = st.fallback(req)
		}
		if s.timed {
			s.phaseObs[phaseOf(req)].Observe(time.Since(t0).Seconds())
		}
	}()
	if s.testHook != nil {
		s.testHook(req)
	}
	return st.handle(req)
}

func phaseOf(req *extprocv3.ProcessingRequest) string {
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "response_trailers"
	}
	return "other"
}

// isRouteRole reads x-fusebox-role: absent or "route" is the route role;
// "attempt" (SPEC §11, not in this round) and anything else get CONTINUE
// replies and record nothing.
func (s *Server) isRouteRole(stream extprocv3.ExternalProcessor_ProcessServer) bool {
	md, _ := metadata.FromIncomingContext(stream.Context())
	v := md.Get(RoleHeader)
	return len(v) == 0 || v[0] == "route" || v[0] == ""
}

// passThrough answers every message with CONTINUE.
func passThrough(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if resp := continueReply(req); resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// compiled caches breaker handles for one Runtime, so a decision looks up
// no map keyed by strings. It is rebuilt when the Runtime changes; handles
// outlive it (state is kept across reloads, R-P9).
type compiled struct {
	rt      *routes.Runtime
	targets map[*routes.Route]*breaker.Target
}

func (s *Server) compiledFor(rt *routes.Runtime) *compiled {
	if c := s.comp.Load(); c != nil && c.rt == rt {
		return c
	}
	s.compMu.Lock()
	defer s.compMu.Unlock()
	if c := s.comp.Load(); c != nil && c.rt == rt {
		return c
	}
	c := &compiled{rt: rt, targets: map[*routes.Route]*breaker.Target{}}
	for _, g := range rt.Gateways {
		for _, r := range g.RouteList {
			t := &breaker.Target{Route: s.store.Breaker(breaker.RouteID(g.ID, r.Key), r.Policy), RoutePolicy: r.Policy}
			if r.Fleet != nil {
				t.Fleet = s.store.Breaker(breaker.FleetID(r.Fleet.Name), r.Fleet.Policy)
				t.FleetPolicy = r.Fleet.Policy
			}
			c.targets[r] = t
			s.publishState(g.ID, r.Key, t.Route, r.Policy)
		}
	}
	for _, name := range rt.FleetNames {
		f := rt.Fleets[name]
		s.publishState("", f.BreakerKey(), s.store.Breaker(breaker.FleetID(name), f.Policy), f.Policy)
	}
	// Only the Runtime in force is cached: a stream still on an older one
	// gets its own value without evicting the current one.
	if s.cfg.Load() == rt {
		s.comp.Store(c)
	}
	return c
}

// publishState sets the state gauge of a breaker from its current state, so
// that every configured route has a series from the first scrape (and a
// reload does not leave a stale one).
func (s *Server) publishState(gateway, key string, b *breaker.Breaker, p *breaker.Policy) {
	st := b.Status(s.clock.Now().UnixNano(), p)
	v := 0.0
	switch st.State {
	case "open":
		v = 1
	case "half_open":
		v = 2
	}
	s.metrics.State.WithLabelValues(gateway, key, b.Provider(), string(st.Scope)).Set(v)
}
