package processor

import (
	"context"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"
)

// Request faults (SPEC R-FD4): the rule and the ledger are judge's
// (judge/requestfault.go), shared with replay (R-FD5). A guess counted as
// the route's would let one request from one client open every route of
// its model for every tenant; judged the request's, it counts for none.
//
// The ledger is this replica's; the fleet shares it through the store's
// notes (rf:<fingerprint>), written off the request path, and read before
// a failure of a request sent again is recorded (the record waits for the
// read off the reply path), so that a retry or a failover attempt landing
// on another replica is known.

// fingerprint names one request's content, keyed.
type fingerprint = judge.Fingerprint

// faultEntry is what the ledger knows of a fingerprint.
type faultEntry = judge.FaultEntry

// faultLedger is this replica's ledger, with its sharing through the store.
type faultLedger struct {
	*judge.FaultLedger
	// shares bounds the note calls under way (sharing is best effort).
	shares chan struct{}
	// aside runs a judging that needs the store off the reply path (go,
	// counted in busy so tests can wait for it; a test holds it).
	aside func(func())
	busy  sync.WaitGroup
}

func newFaultLedger(tokenKey []byte) *faultLedger {
	l := &faultLedger{FaultLedger: judge.NewFaultLedger(tokenKey), shares: make(chan struct{}, 64)}
	l.aside = func(f func()) {
		l.busy.Add(1)
		go func() {
			defer l.busy.Done()
			f()
		}()
	}
	return l
}

// noteName is fp's note in the store.
func noteName(fp fingerprint) string { return "rf:" + hex.EncodeToString(fp[:]) }

// noteValue is what the note holds: "x" (a request fault) or "f" (failed
// once), the answer, and the route.
func noteValue(e *faultEntry) []byte {
	kind := "f"
	if e.Fault {
		kind = "x"
	}
	return []byte(kind + "|" + e.Sig + "|" + e.Route)
}

func parseNote(v []byte, now, ttl int64) (*faultEntry, bool) {
	parts := strings.SplitN(string(v), "|", 3)
	if len(parts) != 3 || (parts[0] != "f" && parts[0] != "x") {
		return nil, false
	}
	return &faultEntry{Fault: parts[0] == "x", Sig: parts[1], Route: parts[2], Until: now + ttl, Logged: parts[0] == "x"}, true
}

// share writes what this replica learned of fp to the store, off the
// request path (dropped when too many are under way: best effort).
func (s *Server) share(fp fingerprint, e faultEntry, ttl time.Duration) {
	select {
	case s.faults.shares <- struct{}{}:
	default:
		return
	}
	go func() {
		defer func() { <-s.faults.shares }()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		name, next := noteName(fp), noteValue(&e)
		var prev []byte
		for range 3 {
			cur, ok, err := s.store.SwapNote(ctx, name, prev, next, ttl)
			if ok || err != nil || (!e.Fault && cur != nil) {
				return // written; or the store failed; or a note is there already
			}
			prev = cur
		}
	}()
}

// readBounded reads fp's note into the ledger unless too many note calls
// are under way (the read is best effort, as sharing is).
func (s *Server) readBounded(fp fingerprint, ttl time.Duration) {
	select {
	case s.faults.shares <- struct{}{}:
	default:
		return
	}
	defer func() { <-s.faults.shares }()
	s.readNote(fp, ttl)
}

// readNote reads fp's note from the store into the ledger.
func (s *Server) readNote(fp fingerprint, ttl time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// prev nil, next nil: a read (deleting a note that is not there).
	cur, _, err := s.store.SwapNote(ctx, noteName(fp), nil, nil, ttl)
	if err != nil || cur == nil {
		return
	}
	now := s.clock.Now().UnixNano()
	if e, ok := parseNote(cur, now, ttl.Nanoseconds()); ok {
		s.faults.Learn(fp, e, now)
	}
}

// answeredOthers is the guard: route (of the stream's gateway) has
// successes at least half of its recorded outcomes in its rate window, by
// the store (on a shared store, every replica's outcomes).
func (st *stream) answeredOthers(route string, now int64) bool {
	r := st.gw.Routes[route]
	if r == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := st.s.store.Status(ctx, breaker.KeyOf(breaker.RouteID(st.gw.ID, route)), now)
	if err != nil {
		return false
	}
	return judge.AnswersOthers(s)
}

// requestFault judges res, the attempt's result, before it is recorded:
// an upstream failure the ledger names the request's is returned as a
// neither (request_fault); anything else unchanged. offPath: it runs
// aside (judgeAside), where the guard may read the store; on the reply
// path it never does, and a failure whose judging would need it (a
// fingerprint another stream has just judged a fault) counts.
func (st *stream) requestFault(res breaker.Result, now int64, offPath bool) breaker.Result {
	st.faultJudged = true
	p := st.chosen.Policy
	o := p.Judge(res)
	if o.Class != breaker.Failure || o.Origin() != breaker.OriginUpstream {
		return res
	}
	sig := o.Reason
	if res.Status != 0 {
		sig = strconv.Itoa(res.Status)
	}
	ttl := int64(p.RequestFaultTTLSec) * int64(time.Second)
	s := st.s
	guard := func(route string) bool { return offPath && st.answeredOthers(route, now) }
	fault, first := s.faults.Judge(st.fp, sig, st.chosen.Key, st.again(), now, ttl, guard)
	e := faultEntry{Sig: sig, Route: st.chosen.Key, Fault: fault}
	s.share(st.fp, e, time.Duration(ttl))
	if !fault {
		return res
	}
	s.metrics.RequestFaults.WithLabelValues(st.gw.ID, st.modelName).Inc()
	if first {
		s.log.Warn("[request_fault] one request's failures are its own, not the route's: they count for no route while it is remembered",
			"gateway", st.gw.ID, "model", st.modelName, "route", st.chosen.Key, "answer", sig,
			"fingerprint", st.fp.Short(), "remembered_sec", p.RequestFaultTTLSec)
	}
	return breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonRequestFault, ElapsedMs: res.ElapsedMs,
		Key: res.Key, KeyLifeMs: res.KeyLifeMs, DecidedAt: res.DecidedAt}
}

// noteFingerprint takes the request's fingerprint once its model is
// known (decide): of its body, or (body nil: decided on its headers) of
// its idempotency key; none when the model's policy does not judge
// request faults. A request that says it is a retry reads the fleet's
// note ahead.
func (st *stream) noteFingerprint(body []byte) {
	if st.model == nil || st.model.Policy.RequestFaultTTLSec <= 0 {
		return
	}
	switch {
	case body != nil:
		st.fp = st.s.faults.Of("body", st.gw.ID, st.modelName, body)
	case st.hasIdem:
		st.fp = st.s.faults.Of("idem", st.gw.ID, st.modelName, st.idem[:])
	default:
		return
	}
	st.hasFP = true
}

// again reports whether this attempt is the request sent again: a
// client's retry (its SDK's retry count, or an idempotency key), or an
// attempt after the first in a failover chain. Only then does a failure
// that repeats the fingerprint's make it a request fault: identical
// bodies from different clients (a health check's fixed prompt) during an
// outage are not one request.
func (st *stream) again() bool { return st.retried || st.hasIdem || st.attempt > 1 }

// judgeAside takes over recording res when judging it needs the store:
// an upstream failure of a fingerprinted request that was sent again (the
// try or attempt before it may have failed on another replica: its note
// is read first), or that this replica's ledger holds as a request fault.
// A failure of a fingerprint the ledger knows only as failed, in a
// request not sent again, can be no request fault (identical bodies from
// different clients are not one request): it is recorded on the reply
// path, before the reply, as every other outcome, so that the client's
// next request meets the breaker it moved. On an in-process store
// (memory), whose calls cannot stall, the judging that needs the store
// happens there too, before the reply. The routes' guard
// is then read from the store too (every replica's outcomes, not this
// one's). Both are calls the reply must not wait for: the judging and
// the record happen off the reply path, as a record waiting for an
// arrival's note does. It reports whether it took res.
func (st *stream) judgeAside(res breaker.Result, now int64, withMeta bool) bool {
	if !st.hasFP || st.faultJudged || st.chosen.Policy.RequestFaultTTLSec <= 0 {
		return false
	}
	o := st.chosen.Policy.Judge(res)
	if o.Class != breaker.Failure || o.Origin() != breaker.OriginUpstream {
		return false
	}
	known, fault := st.s.faults.Has(st.fp, now)
	if !fault && !st.again() {
		return false
	}
	st.faultJudged = true
	ttl := time.Duration(st.chosen.Policy.RequestFaultTTLSec) * time.Second
	judge := func(withMeta bool) {
		if !known {
			st.s.readBounded(st.fp, ttl)
		}
		st.keyRecord(&res)
		res = st.requestFault(res, now, true)
		st.applyJudged(res, now, withMeta)
	}
	if st.s.storeInProcess {
		judge(withMeta)
	} else {
		st.s.faults.aside(func() { judge(false) })
	}
	return true
}

// attemptFingerprint takes the fingerprint the route role put in the
// chain's token, for attempt n: an attempt after the first (another route
// of the same request) or of a retried request reads the fleet's note
// ahead, since the attempt before it may have failed on another replica.
func (st *stream) attemptFingerprint(t attemptToken, n int) {
	if t.FP == "" || st.chosen.Policy.RequestFaultTTLSec <= 0 {
		return
	}
	b, err := hex.DecodeString(t.FP)
	if err != nil || len(b) != len(st.fp) {
		return
	}
	copy(st.fp[:], b)
	st.hasFP, st.retried = true, t.Retried
}
