package processor

import (
	"errors"
	"io"
	"runtime/debug"

	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/streamlife"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// The access log channel (SPEC §4a, R-AL1..R-AL6): Envoy's gRPC access log
// service delivers Envoy's own outcomes (connect failures, route timeouts,
// no healthy host, no cluster) on every Envoy version, including where the
// route role never sees them (1.34–1.36) and where no ext_proc does (the
// failover deployment's last attempt). decisions.go says how an entry and
// the ext_proc stream agree on one outcome.

// Results of fusebox_access_log_entries_total{result}.
const (
	EntryRecorded        = "recorded"
	EntryDuplicate       = "duplicate"
	EntryUnknown         = "unknown_decision"
	EntryNoDecision      = "no_decision"
	EntryClusterMismatch = "cluster_mismatch"
	EntryIgnored         = "ignored"
	EntryDropped         = "dropped" // every worker was busy (the store stalled)
	EntryResent          = "resent"  // the store did not answer: sent again until it does
)

// entryOutcome is what one access log entry says of its request.
type entryOutcome struct {
	res breaker.Result
	// trace: the decision's span as its metadata names it (R-TR3); ""
	// when it was not traced.
	trace   string
	cluster string // upstream_cluster: "" when no host was picked (NC, UH)
	attempt uint32 // upstream_request_attempt_count, 0 unknown
	flags   uint64 // the judged response flags (judge.EntryFlags)
	// gateway and chain: a failover decision's gateway and chain (route
	// keys), for an NC/UH entry no attempt stream will record (R-AL5).
	// They come only from the decision's own sealed token (sealedChain),
	// never from fields a sender chose; groups are its admissions.
	gateway string
	chain   []string
	groups  []attemptGroup
	// token is the sealed attempt token the entry carried (fusebox.token),
	// opened by sealedChain.
	token string
	// id names the entry's note operations (newOpID).
	id string
}

// noteOp is the entry as an operation on its decision's note: its id
// makes sending it again after an unknown answer get the same answer.
func (o *entryOutcome) noteOp() lifecycle.Op { return lifecycle.Op{ID: o.id, Entry: o.op()} }

// op is the entry as the decision's note table reads it.
func (o *entryOutcome) op() *lifecycle.Entry {
	return &lifecycle.Entry{Res: o.res, Cluster: o.cluster, Attempt: o.attempt, Chained: o.chained()}
}

// fromEntry is an entry the note table kept or claimed.
func fromEntry(e lifecycle.Entry) entryOutcome {
	return entryOutcome{res: e.Res, cluster: e.Cluster, attempt: e.Attempt}
}

// matchesNote reports whether the entry speaks for the parked party p.
func (o entryOutcome) matchesNote(p *lifecycle.Park) bool { return o.op().Matches(p) }

// chained: the entry is an NC/UH of a failover decision (no host picked,
// so no attempt stream), to be charged to its attempt's chain group.
func (o *entryOutcome) chained() bool {
	return o.cluster == "" && o.attempt >= 1 && len(o.chain) > 0 && o.gateway != ""
}

// AccessLogService returns the envoy.service.accesslog.v3.AccessLogService
// that feeds the access log channel; mainlib registers it on the ext_proc
// listener (R-AL1).
func (s *Server) AccessLogService() accesslogv3.AccessLogServiceServer { return accessLogServer{s: s} }

type accessLogServer struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	s *Server
}

// StreamAccessLogs reads one Envoy worker's entries until it closes. The
// stream counts against limits.max_concurrent_streams and obeys the stream
// lifetime bounds like an ext_proc stream (R-L13; before, 10,000 idle access
// log streams held 163 MB), and its entries are settled by bounded workers,
// never on this receive loop (R-DL8: settling may take a store round trip).
func (a accessLogServer) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	s := a.s
	return s.bounded(stream.Context(), func(act *streamlife.Activity) error {
		s.accessLogStreams(1)
		defer s.accessLogStreams(-1)
		return s.readAccessLogs(stream, act)
	})
}

func (s *Server) readAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer, act *streamlife.Activity) error {
	for {
		msg, err := stream.Recv()
		if act != nil {
			act.Touch()
		}
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
			}
			return s.recvErr(err)
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			s.dispatchEntry(e)
		}
	}
}

// maxEntryWorkers bounds the entries settled at once: each takes at most
// the store's op timeout, so a full set means the store is stalled.
const maxEntryWorkers = 256

// dispatchEntry hands an entry to a worker; when every worker is busy it
// is dropped and counted rather than held on the receive loop.
func (s *Server) dispatchEntry(e *accesslogdatav3.HTTPAccessLogEntry) {
	select {
	case s.entryWorkers <- struct{}{}:
		go func() {
			defer func() { <-s.entryWorkers }()
			s.onAccessLogEntry(e)
		}()
	default:
		s.metrics.AccessLogEntries.WithLabelValues(EntryDropped).Inc()
	}
}

func (s *Server) accessLogStreams(d int64) {
	n := s.alStreams.Add(d)
	if s.onAccessLogStreams != nil {
		s.onAccessLogStreams(n)
	}
}

// onAccessLogEntry takes one entry: it records the outcome of the decision
// it names when no ext_proc stream has, and is counted by what became of it.
// A panic is absorbed like a message's (R-D7).
func (s *Server) onAccessLogEntry(e *accesslogdatav3.HTTPAccessLogEntry) {
	defer func() {
		if p := recover(); p != nil {
			s.metrics.InternalErrors.WithLabelValues("panic").Inc()
			s.log.Error("recovered a panic while reading an access log entry", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	s.metrics.AccessLogEntries.WithLabelValues(s.takeEntry(e)).Inc()
}

func (s *Server) takeEntry(e *accesslogdatav3.HTTPAccessLogEntry) string {
	cp := e.GetCommonProperties()
	// Only the entry written when the request completed speaks for its
	// outcome (not a periodic or start-of-stream one, nor the router's
	// per-attempt upstream_log). Envoys that do not set the type set none.
	if t := cp.GetAccessLogType(); t != accesslogdatav3.AccessLogType_NotSet && t != accesslogdatav3.AccessLogType_DownstreamEnd {
		return EntryIgnored
	}
	id := cp.GetMetadata().GetFilterMetadata()["fusebox"].GetFields()["decision"].GetStringValue()
	if id == "" || len(id) > 64 {
		return EntryNoDecision
	}
	out := entryResult(e)
	if s.tracer != nil {
		out.trace = cp.GetMetadata().GetFilterMetadata()["fusebox"].GetFields()[traceKey].GetStringValue()
	}
	s.reached.note(out.cluster)
	out.id = lifecycle.NewOpID('e')
	s.sealedChain(id, &out)
	if s.labelled(id, out) {
		return EntryRecorded
	}
	r := s.settleEntry(id, out)
	if r != EntryClusterMismatch && out.res.Kind == breaker.KindNeither && out.cluster != "" {
		// A broken answer's label, for a stream that has not ended here
		// yet: the observer's, which its note lets record though this
		// entry came first (the entry waited there, or is a duplicate).
		// Kept for access_log.wait_ms; unused when the entry recorded.
		s.labels.keepEarly(id, out.res.Reason, s.clock.Now().UnixNano(), s.cfg.Load().AccessLogWait.Nanoseconds())
	}
	return r
}

// settleEntry applies an entry to decision id: its stream here, or its
// note.
func (s *Server) settleEntry(id string, out entryOutcome) string {
	if p := s.decisions.get(id); p != nil {
		return s.entryForStream(p, id, out)
	}
	if done, parked := s.decisions.wasDone(id); done && !parked {
		return EntryDuplicate
	}
	// A decision this replica does not hold: another replica's route
	// role (Envoy's access log stream goes to one replica per worker), or
	// a chained decision's parked attempt, or one whose wait ended here
	// (the note says whether the entry is late or a duplicate). Its note
	// settles it, in either order: an entry that comes first waits there.
	if r, ok := s.meet.entry(id, out); ok {
		return r
	}
	return EntryUnknown
}

// entryResult judges an entry as the route role judges response headers
// (R-AL4): Envoy's flags first; a provider's own answer (via_upstream) by
// the status list; a client that went away (DC, DR) is a neither. An entry
// carries no body, so a 2xx cannot show an answer: a neither.
func entryResult(e *accesslogdatav3.HTTPAccessLogEntry) entryOutcome {
	cp := e.GetCommonProperties()
	f := cp.GetResponseFlags()
	flags := judge.EntryFlags(f)
	details := e.GetResponse().GetResponseCodeDetails()
	h := judge.Head{Status: int(e.GetResponse().GetResponseCode().GetValue()), Flags: flags, HasFlags: true,
		Details: details, HasDetails: details != "", EndOfStream: true}
	res, _ := judge.JudgeHead(h)
	if d := cp.GetDuration(); d != nil {
		res.ElapsedMs = d.AsDuration().Milliseconds()
	}
	switch res.Kind {
	case breaker.KindConnError, breaker.KindTimeout, breaker.KindNeither:
	default:
		if flags&judge.ClientFlags != 0 || res.Kind == breaker.KindAnswered {
			res = breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel, ElapsedMs: res.ElapsedMs}
		}
	}
	out := entryOutcome{res: res, cluster: cp.GetUpstreamCluster(), attempt: cp.GetUpstreamRequestAttemptCount(), flags: flags}
	if out.cluster == "" && (flags&(judge.FlagNC|judge.FlagUH) != 0) {
		out.token = cp.GetMetadata().GetFilterMetadata()["fusebox"].GetFields()[tokenKey].GetStringValue()
	}
	return out
}

// tokenKey names, in the fusebox namespace, a failover decision's sealed
// attempt token: the access log entry of a no-host reply carries it back,
// and it alone says which routes the entry may charge (R-AL5).
const tokenKey = "token"

// sealedChain gives a no-host entry (NC, UH: no upstream_cluster) the
// chain it may charge: the one sealed in its decision's token, when the
// token opens with the fleet key and names decision id. The plain chain
// and gateway fields are the access log line's, for people and replay: an
// entry that forged them, or named a made-up id, charges nothing and goes
// through the budget for unknown decisions (R-DL5). A first attempt's
// no-host reply carries no attempt count (router.cc decodeHeaders answers
// before it sets one): it is attempt 1.
func (s *Server) sealedChain(id string, out *entryOutcome) {
	if out.token == "" {
		return
	}
	t, err := s.parseAttemptToken(out.token)
	out.token = ""
	if err != nil || t.Decision != id {
		return
	}
	out.gateway, out.groups = t.Gateway, t.Chain
	out.chain = make([]string, len(t.Chain))
	for i, g := range t.Chain {
		out.chain[i] = g.Route
	}
	if out.attempt == 0 {
		out.attempt = 1
	}
}
