package processor

import (
	"errors"
	"io"
	"runtime/debug"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
)

// entryOutcome is what one access log entry says of its request.
type entryOutcome struct {
	res     breaker.Result
	cluster string // upstream_cluster: "" when no host was picked (NC, UH)
	attempt uint32 // upstream_request_attempt_count, 0 unknown
}

// AccessLogService returns the envoy.service.accesslog.v3.AccessLogService
// that feeds the access log channel; mainlib registers it on the ext_proc
// listener (R-AL1).
func (s *Server) AccessLogService() accesslogv3.AccessLogServiceServer { return accessLogServer{s: s} }

type accessLogServer struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	s *Server
}

// StreamAccessLogs reads one Envoy worker's entries until it closes.
func (a accessLogServer) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	s := a.s
	s.accessLogStreams(1)
	defer s.accessLogStreams(-1)
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return s.recvErr(err)
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			s.onAccessLogEntry(e)
		}
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
	if p := s.decisions.get(id); p != nil {
		return s.entryForStream(p, id, out)
	}
	if s.decisions.wasDone(id) {
		return EntryDuplicate
	}
	// A decision this replica does not hold: another replica's route
	// role (Envoy's access log stream goes to one replica per worker), or
	// a chained decision's parked attempt. Its note settles it, in either
	// order: an entry that comes first waits in the note.
	if r, ok := s.meet.entry(id, out); ok {
		return r
	}
	return EntryUnknown
}

// entryForStream applies an entry to a route-role decision (R-AL3).
func (s *Server) entryForStream(p *pending, id string, out entryOutcome) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.st
	if out.cluster != "" && out.cluster != st.chosen.Cluster {
		// A client cannot steer an outcome onto another route (R-AL4).
		return EntryClusterMismatch
	}
	switch p.state {
	case pendingDone:
		return EntryDuplicate
	case pendingLive:
		// The stream may still see its own response; it decides at its end.
		if p.entry == nil {
			p.entry = &out
		}
		return EntryRecorded
	}
	// Waiting: the decision is parked in its note, where an entry that
	// reached another replica may claim it too; whoever claims records.
	if p.parked != nil {
		switch act := s.meet.run(id, nil, meetOp{entry: &out}); act.how {
		case meetEntry:
		case meetMismatch:
			return EntryClusterMismatch
		case meetFailed:
			// The store refused: settle here.
		default:
			return EntryDuplicate // claimed elsewhere meanwhile
		}
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	st.recordEntry(out)
	p.state = pendingDone
	s.decisions.forget(id, st.rt.AccessLogWait, true)
	return EntryRecorded
}

// recordEntry records what an entry says for st's decision.
func (st *stream) recordEntry(out entryOutcome) {
	st.reportClusterNotFound(out.res)
	st.record(out.res, st.now())
}

// finishDecision ends a route-role stream's decision (called by finish,
// with no outcome recorded by the stream's own response when noResponse):
// an entry that came first is recorded now; otherwise the stream waits up
// to access_log.wait_ms for one, then is a neither (R-O8). A stream that
// broke after its response started is a neither at once (R-O9).
func (st *stream) finishDecision(noResponse bool) {
	s := st.s
	p := s.decisions.get(st.decisionID)
	if p == nil {
		if !st.recorded {
			st.recordNeither()
		}
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := st.rt.AccessLogWait
	observed := st.rt.Envoy.Observer && noResponse && !st.recorded
	if observed {
		// The observer deployment: the route role's stream always ends
		// before the response (it has no response phases); the observer
		// records it (observe.go), on whichever replica its stream went
		// to. The decision waits in its note for it, as for an entry.
		wait = max(wait, observeWait)
	}
	switch {
	case st.recorded:
	case noResponse && p.entry != nil && !observed:
		st.recordEntry(*p.entry)
	case noResponse && wait > 0:
		// Waiting whether or not a channel stream is connected now: Envoy
		// opens its access log stream at its first entry (and again after
		// fusebox restarts), so the entry that would connect it is the
		// very one this stream may be waiting for. The entry may reach
		// any replica: the decision is parked in its note (meet.go), and
		// an entry that came first to another replica waits there.
		id := st.decisionID
		note := parkedNote{Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
			RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease, Start: st.startNs}
		act := s.meet.run(id, nil, meetOp{park: &note})
		if act.how == meetByObserver {
			break // the observer came first: it records
		}
		if act.how == meetEntry {
			st.recordEntry(act.res)
			s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
			break
		}
		if act.how == meetParked && p.entry != nil {
			// An entry reached this replica while the stream ran: it
			// claims the parked decision unless the observer did.
			if a := s.meet.run(id, nil, meetOp{entry: p.entry}); a.how == meetEntry || a.how == meetFailed {
				st.recordEntry(*p.entry)
				break
			} else if a.how == meetByObserver {
				break
			}
		}
		if act.how == meetParked {
			p.parked = &note
		}
		p.state = pendingWaiting
		p.timer = time.AfterFunc(wait, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.state != pendingWaiting {
				return
			}
			if p.parked != nil {
				cur := attemptNote{Parked: p.parked}
				if a := s.meet.run(id, cur.encode(), meetOp{park: p.parked, expire: true}); a.how == meetNeither || a.how == meetFailed {
					st.recordNeither()
				}
			} else {
				st.recordNeither()
			}
			p.state = pendingDone
			s.decisions.forget(id, wait, true)
		})
		return
	default:
		st.recordNeither()
	}
	p.state = pendingDone
	// Envoy logs an entry only for its own endings (the shipped filter):
	// remember the decision only when the response showed one.
	s.decisions.forget(st.decisionID, wait, st.envoyEnded || noResponse)
}

// entryResult judges an entry as the route role judges response headers
// (R-AL4): Envoy's flags first; a provider's own answer (via_upstream) by
// the status list; a client that went away (DC) is a neither. An entry
// carries no body, so a 2xx cannot show an answer: a neither.
func entryResult(e *accesslogdatav3.HTTPAccessLogEntry) entryOutcome {
	cp := e.GetCommonProperties()
	f := cp.GetResponseFlags()
	var flags uint64
	for _, b := range []struct {
		on  bool
		bit uint64
	}{
		{f.GetNoHealthyUpstream(), flagUH}, {f.GetUpstreamRequestTimeout(), flagUT}, {f.GetLocalReset(), flagLR},
		{f.GetUpstreamRemoteReset(), flagUR}, {f.GetUpstreamConnectionFailure(), flagUF},
		{f.GetUpstreamConnectionTermination(), flagUC}, {f.GetUpstreamOverflow(), flagUO},
		{f.GetUpstreamRetryLimitExceeded(), flagURX}, {f.GetUpstreamProtocolError(), flagUPE}, {f.GetNoClusterFound(), flagNC},
	} {
		if b.on {
			flags |= b.bit
		}
	}
	details := e.GetResponse().GetResponseCodeDetails()
	h := respHead{status: int(e.GetResponse().GetResponseCode().GetValue()), flags: flags, hasFlags: true,
		details: details, hasDetails: details != "", endOfStream: true}
	res, _ := judgeHead(h)
	if d := cp.GetDuration(); d != nil {
		res.ElapsedMs = d.AsDuration().Milliseconds()
	}
	switch res.Kind {
	case breaker.KindConnError, breaker.KindTimeout, breaker.KindNeither:
	default:
		if f.GetDownstreamConnectionTermination() || f.GetDownstreamRemoteReset() || res.Kind == breaker.KindAnswered {
			res = breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonClientCancel, ElapsedMs: res.ElapsedMs}
		}
	}
	return entryOutcome{res: res, cluster: cp.GetUpstreamCluster(), attempt: cp.GetUpstreamRequestAttemptCount()}
}
