package processor

import (
	"errors"
	"io"
	"runtime/debug"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
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
	EntryDropped         = "dropped" // every worker was busy (the store stalled)
)

// entryOutcome is what one access log entry says of its request.
type entryOutcome struct {
	res     breaker.Result
	cluster string // upstream_cluster: "" when no host was picked (NC, UH)
	attempt uint32 // upstream_request_attempt_count, 0 unknown
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
}

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
	return s.bounded(stream.Context(), func(act *activity) error {
		s.accessLogStreams(1)
		defer s.accessLogStreams(-1)
		return s.readAccessLogs(stream, act)
	})
}

func (s *Server) readAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer, act *activity) error {
	for {
		msg, err := stream.Recv()
		if act != nil {
			act.touch()
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
	s.sealedChain(id, &out)
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

// entryForStream applies an entry to a route-role decision (R-AL3).
func (s *Server) entryForStream(p *pending, id string, out entryOutcome) string {
	p.mu.Lock()
	st := p.st
	if out.cluster != "" && out.cluster != st.chosen.Cluster {
		p.mu.Unlock()
		// A client cannot steer an outcome onto another route (R-AL4).
		return EntryClusterMismatch
	}
	state, parked := p.state, p.parked
	if state == pendingLive || state == pendingParking {
		// The stream may still see its own response, or is writing its
		// note: it decides at its end with this entry.
		if p.entry == nil {
			p.entry = &out
		}
		p.mu.Unlock()
		return EntryRecorded
	}
	p.mu.Unlock()
	if state == pendingDone {
		return EntryDuplicate
	}
	// Waiting: the decision is parked in its note, where an entry that
	// reached another replica may claim it too; whoever claims records.
	claimed := false
	if parked != nil {
		switch act := s.meet.run(id, nil, lifecycle.Op{Entry: out.op()}); act.How {
		case lifecycle.HowEntry:
			claimed = true
			if s.entryClaimHook != nil {
				s.entryClaimHook()
			}
		case lifecycle.HowUnreachable:
			// Ours (a meeting place that did not answer: the real outcome
			// is recorded here, R-DL7).
		case lifecycle.HowMismatch:
			return EntryClusterMismatch
		default:
			return EntryDuplicate // claimed elsewhere meanwhile
		}
	}
	// The note's claim is the authority: a recheck (recheckDecision) that
	// read the note just after this claim sees it settled and may end the
	// wait first, and this entry still records what it claimed.
	if !p.end() && !claimed {
		return EntryDuplicate
	}
	st.recordEntry(out)
	s.forgetDecision(id, true, parked != nil)
	return EntryRecorded
}

// recordEntry records what an entry says for st's decision.
func (st *stream) recordEntry(out entryOutcome) {
	st.reportClusterNotFound(out.res)
	st.record(out.res, st.now())
}

// finishDecision ends a route-role stream's decision (called by finish,
// with no outcome recorded by the stream's own response when noResponse):
// an entry that came first is recorded now; otherwise the decision waits
// in its note (decisionWait), then is a neither (R-O8). A stream that broke
// after its response started is a neither at once (R-O9).
func (st *stream) finishDecision(noResponse bool) {
	s := st.s
	p := s.decisions.get(st.decisionID)
	if p == nil {
		if !st.recorded {
			st.recordNeither()
		}
		return
	}
	wait := st.decisionWait(noResponse)
	p.mu.Lock()
	entry := p.entry
	switch {
	case st.recorded || !noResponse || wait == 0 || entry != nil && !st.rt.Envoy.Observer:
		p.state = pendingDone
		p.mu.Unlock()
		switch {
		case st.recorded:
		case noResponse && entry != nil:
			st.recordEntry(*entry)
		default:
			st.recordNeither()
		}
		// Envoy logs an entry only for its own endings (the shipped
		// filter): remember the decision only when the response showed one.
		s.forgetDecision(st.decisionID, st.envoyEnded || noResponse, false)
		return
	}
	p.state = pendingParking
	p.mu.Unlock()
	st.parkDecision(p, wait)
}

// decisionWait is how long a decision whose stream ended with no response
// waits in its note: for its response to begin on the observer when the
// stream closed early (Envoy 1.37+ closes it after the last request reply,
// R-DL3: decision_wait_sec), else for Envoy's entry (access_log.wait_ms).
func (st *stream) decisionWait(noResponse bool) time.Duration {
	if st.rt.Envoy.Observer && noResponse && !st.recorded {
		return max(st.rt.DecisionWait, st.rt.AccessLogWait)
	}
	return st.rt.AccessLogWait
}

// parkDecision writes the decision's note and waits: whether or not a
// channel stream is connected now (Envoy opens its access log stream at
// its first entry, and again after fusebox restarts, so the entry that
// would connect it is the very one this stream may be waiting for), and on
// any replica (an entry or the observer that came first to another one
// waits in the note). No lock is held across a store call.
func (st *stream) parkDecision(p *pending, wait time.Duration) {
	s := st.s
	id := st.decisionID
	note := lifecycle.Park{Gateway: st.gw.ID, Route: st.chosen.Key, Cluster: st.chosen.Cluster,
		RouteGen: st.adm.Route.Gen, RouteLease: st.adm.Route.Lease, FleetGen: st.adm.Fleet.Gen, FleetLease: st.adm.Fleet.Lease, Start: st.startNs}
	act := s.meet.run(id, nil, lifecycle.Op{Park: &note})
	parked := act.How == lifecycle.HowParked
	settle := func(record func()) {
		if p.end() && record != nil {
			record()
		}
		s.forgetDecision(id, true, parked)
	}
	switch act.How {
	case lifecycle.HowByObserver, lifecycle.HowDuplicate:
		settle(nil) // the observer or an entry came first: it records
		return
	case lifecycle.HowEntry:
		settle(func() {
			st.recordEntry(fromEntry(act.Res))
			s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
		})
		return
	case lifecycle.HowParked:
	default:
		// The note could not be written (the meeting place did not answer,
		// or its table is full): the decision waits here alone, where an
		// entry that reaches this replica still settles it (R-DL5, R-DL7).
		parked = false
	}
	if parked && !s.held.take() {
		// Past the bound (held.go): the note keeps it, and every channel
		// on every replica settles it there; this replica lets it go.
		s.metrics.DecisionEvents.WithLabelValues("park", "not_held").Inc()
		p.mu.Lock()
		entry := p.entry
		p.mu.Unlock()
		if entry != nil {
			// An entry reached this replica while the stream ran: it
			// claims the parked decision unless the observer did.
			if a := s.meet.run(id, nil, lifecycle.Op{Entry: entry.op()}); a.How == lifecycle.HowEntry || a.How == lifecycle.HowUnreachable {
				settle(func() { st.recordEntry(*entry) })
				return
			}
		}
		if p.end() {
			s.forgetDecision(id, true, true)
		}
		return
	}
	p.mu.Lock()
	entry := p.entry
	p.state = pendingWaiting
	if parked {
		p.parked = &note
		p.held = &s.held
	}
	p.timer = breaker.AfterFunc(s.clock, wait, func() { st.expireDecision(p, note, wait) })
	p.mu.Unlock()
	if entry == nil {
		if !parked && act.How == lifecycle.HowUnreachable {
			st.reparkDecision(p, note)
		}
		if parked {
			st.recheckDecision(p, note, 0, wait)
		}
		return
	}
	if !parked {
		settle(func() { st.recordEntry(*entry) })
		return
	}
	// An entry reached this replica while the stream ran: it claims the
	// parked decision unless the observer did.
	switch a := s.meet.run(id, nil, lifecycle.Op{Entry: entry.op()}); a.How {
	case lifecycle.HowEntry, lifecycle.HowUnreachable:
		settle(func() { st.recordEntry(*entry) })
	case lifecycle.HowByObserver, lifecycle.HowDuplicate:
		settle(nil)
	}
}

// reparkDecision writes the note of a decision that could not park (the
// meeting place did not answer) once it answers again, every reparkEvery
// while the decision waits here: an entry or an observer that reaches
// another replica after the blip then meets it (R-DL12). Before, it waited
// on this replica alone, and such an entry waited in a note nobody read.
func (st *stream) reparkDecision(p *pending, note lifecycle.Park) {
	s := st.s
	id := st.decisionID
	var try func()
	try = func() {
		p.mu.Lock()
		waiting := p.state == pendingWaiting && p.parked == nil
		p.mu.Unlock()
		if !waiting {
			return
		}
		act := s.meet.run(id, nil, lifecycle.Op{Park: &note})
		settle := func(record func()) {
			if p.end() && record != nil {
				record()
			}
			s.forgetDecision(id, true, true)
		}
		switch act.How {
		case lifecycle.HowUnreachable:
			p.mu.Lock()
			if p.state == pendingWaiting {
				breaker.AfterFunc(s.clock, reparkEvery, try)
			}
			p.mu.Unlock()
		case lifecycle.HowParked, lifecycle.HowDuplicate:
			// Parked now, or already: the write whose answer was lost had
			// run.
			p.mu.Lock()
			if p.state == pendingWaiting {
				p.parked = &note // its expiry goes through the note now
			}
			p.mu.Unlock()
		case lifecycle.HowEntry:
			settle(func() {
				st.recordEntry(fromEntry(act.Res))
				s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
			})
		case lifecycle.HowByObserver:
			settle(nil) // another channel recorded it, on another replica
		}
	}
	breaker.AfterFunc(s.clock, reparkEvery, try)
}

// recheckAfter is when a decision held here while it waits in its note
// reads the note again: the observer that settles it is often on another
// replica (the observer profile), which records it in the note and never
// tells this one. Three reads at most, so a decision costs at most three
// note operations more, and one settled elsewhere is let go within 5 s,
// 30 s or 2 min of its park instead of decision_wait_sec (300 s).
var recheckAfter = [...]time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute}

// recheckDecision reads the note of a decision held here, at
// recheckAfter[i] after its park (unless its wait ends first): a decision
// another replica's observer or entry settled is let go (held.go's count
// given back); one still parked waits for the next read or its expiry.
// Before (#49's figure), a replica in the observer profile held every
// decision the other replica observed for its whole wait: 65,536 held, its
// bound, after 5 minutes at 1,000 decisions a second.
func (st *stream) recheckDecision(p *pending, note lifecycle.Park, i int, wait time.Duration) {
	if i >= len(recheckAfter) || recheckAfter[i] >= wait {
		return
	}
	s := st.s
	id := st.decisionID
	delay := recheckAfter[i]
	if i > 0 {
		delay -= recheckAfter[i-1]
	}
	breaker.AfterFunc(s.clock, delay, func() {
		p.mu.Lock()
		waiting := p.state == pendingWaiting && p.parked != nil
		p.mu.Unlock()
		if !waiting {
			return
		}
		// A park of what is parked already reads the note: Duplicate
		// while it still waits, ByObserver or Entry once a channel came.
		// Only a note that exists: a settled note lives a park time (5 s)
		// and then is gone, and a park then would make a fresh one that
		// its expiry would count as a neither. A note that is gone leaves
		// the decision to its expiry, as before the rechecks.
		act := s.meet.runExisting(id, lifecycle.Op{Park: &note})
		switch act.How {
		case lifecycle.HowByObserver:
			s.metrics.DecisionEvents.WithLabelValues("recheck", "settled_elsewhere").Inc()
			if p.end() {
				s.forgetDecision(id, true, true)
			}
		case lifecycle.HowEntry:
			if p.end() {
				st.recordEntry(fromEntry(act.Res))
				s.metrics.AccessLogEntries.WithLabelValues(EntryRecorded).Inc()
			}
			s.forgetDecision(id, true, true)
		default: // still parked (or the note did not answer): read it later
			st.recheckDecision(p, note, i+1, wait)
		}
	})
}

// expireDecision ends a parked decision's wait: a neither that frees its
// slot, unless a channel claimed it first. The note keeps it as expired,
// so a real outcome that comes later is still recorded (R-DL2); an expiry
// that cannot reach the note records nothing (R-DL7).
func (st *stream) expireDecision(p *pending, note lifecycle.Park, wait time.Duration) {
	p.mu.Lock()
	waiting := p.state == pendingWaiting
	p.mu.Unlock()
	if !waiting {
		return
	}
	p.mu.Lock()
	parked := p.parked != nil
	p.mu.Unlock()
	how := lifecycle.HowNeither // waiting here alone: nothing else can claim it
	if parked {
		cur := lifecycle.Note{Parked: &note}
		how = st.s.meet.run(st.decisionID, cur.Encode(), lifecycle.Op{Park: &note, Expire: true}).How
	}
	if p.end() && how == lifecycle.HowNeither {
		st.recordNeitherExpired()
	}
	st.s.forgetDecision(st.decisionID, true, parked)
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
		{f.GetStreamIdleTimeout(), flagSI}, {f.GetUpstreamMaxStreamDurationReached(), flagUMSDR}, {f.GetDurationTimeout(), flagDT},
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
	out := entryOutcome{res: res, cluster: cp.GetUpstreamCluster(), attempt: cp.GetUpstreamRequestAttemptCount()}
	if out.cluster == "" && (flags&(flagNC|flagUH) != 0) {
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
