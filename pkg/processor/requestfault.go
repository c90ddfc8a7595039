package processor

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Request faults (SPEC R-FD4). Some failures name the request, not the
// route: a provider answers 500 to one malformed tool schema, one image
// its decoder rejects, one prompt that crashes a worker, and the SDKs
// retry it twice by themselves. Counted as the route's, one such request
// from one client opens every route of its model for every tenant.
//
// A request's fingerprint is a keyed hash (the fleet's token key) of its
// gateway, model and body, or of its idempotency key when fusebox did not
// read the body; never the body itself, and never written in clear. When
// the same fingerprint fails again with the same answer (a client's retry,
// or the same request sent again) while each route involved answers other
// requests (successes at least half of its outcomes in the rate window),
// the failure is the request's: recorded as a neither (request_fault),
// and the fingerprint is remembered for request_fault_ttl_sec, so that its
// later failures are neither too. Every other failure counts as before; a
// real outage, which fails every request, never passes the guard.
//
// The ledger is this replica's; the fleet shares it through the store's
// notes (rf:<fingerprint>), written off the request path, and read before
// a failure of a request sent again is recorded (the record waits for the
// read off the reply path), so that a retry or a failover attempt landing
// on another replica is known.

// fingerprint names one request's content, keyed.
type fingerprint [16]byte

func (f fingerprint) short() string { return hex.EncodeToString(f[:4]) }

// faultEntry is what the ledger knows of a fingerprint.
type faultEntry struct {
	sig    string // the failed answer ("503", or a reason without a status)
	route  string // the route it first failed on
	fault  bool   // judged the request's own
	until  int64  // unix ns: forgotten after
	logged bool
}

// faultLedger is this replica's memory of failed fingerprints, bounded.
type faultLedger struct {
	key []byte
	mu  sync.Mutex
	m   map[fingerprint]*faultEntry
	// shares bounds the note calls under way (sharing is best effort).
	shares chan struct{}
	// aside runs a judging that needs the store off the reply path (go,
	// counted in busy so tests can wait for it; a test holds it).
	aside func(func())
	busy  sync.WaitGroup
}

// maxLedger bounds the fingerprints a replica remembers.
const maxLedger = 1 << 14

func newFaultLedger(tokenKey []byte) *faultLedger {
	k := tokenKey
	if len(k) == 0 {
		k = make([]byte, 32)
		_, _ = rand.Read(k)
	}
	h := sha256.Sum256(append([]byte("fusebox request fingerprint\x00"), k...))
	l := &faultLedger{key: h[:], m: map[fingerprint]*faultEntry{}, shares: make(chan struct{}, 64)}
	l.aside = func(f func()) {
		l.busy.Add(1)
		go func() {
			defer l.busy.Done()
			f()
		}()
	}
	return l
}

// of is the fingerprint of a request's content (kind "body") or of its
// idempotency key (kind "idem") on gateway gw for model. The content is
// summed by two CRC-32s (Castagnoli and IEEE, both in hardware: an 8 KiB
// body costs 0.5 µs where SHA-256 over it cost 5 µs, and a 1 MiB prompt
// would have cost 0.6 ms on the decision path), and the keyed SHA-256 of
// the sums, the length and the names is the fingerprint: 64 bits of
// content are plenty to tell apart the requests of ten minutes, and
// nothing of the content is kept.
func (l *faultLedger) of(kind, gw, model string, content []byte) fingerprint {
	buf := make([]byte, 0, 128)
	buf = append(buf, l.key...)
	for _, s := range []string{kind, gw, model} {
		buf = append(buf, s...)
		buf = append(buf, 0)
	}
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(content)))
	buf = binary.BigEndian.AppendUint32(buf, crc32.Checksum(content, castagnoli))
	buf = binary.BigEndian.AppendUint32(buf, crc32.ChecksumIEEE(content))
	sum := sha256.Sum256(buf)
	var f fingerprint
	copy(f[:], sum[:])
	return f
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// judge decides one upstream failure of fp (answer sig, on route) at now:
// fault when fp is remembered as a request fault, or failed before with
// the same answer, and guard passes every route involved; first when this
// call made it one (its log line is due).
func (l *faultLedger) judge(fp fingerprint, sig, route string, again bool, now, ttl int64, guard func(route string) bool) (fault, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[fp]
	if e != nil && e.until <= now {
		delete(l.m, fp)
		e = nil
	}
	switch {
	case e != nil && e.fault:
		if !guard(route) {
			return false, false
		}
		e.until = now + ttl
		return true, false
	case e != nil && e.sig == sig && again:
		if !guard(route) || (e.route != route && !guard(e.route)) {
			return false, false
		}
		e.fault, e.until = true, now+ttl
		first = !e.logged
		e.logged = true
		return true, first
	}
	l.put(fp, &faultEntry{sig: sig, route: route, until: now + ttl}, now)
	return false, false
}

// has reports whether the ledger remembers fp (a failure or a fault),
// and whether as a fault.
func (l *faultLedger) has(fp fingerprint, now int64) (known, fault bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[fp]
	if e == nil || e.until <= now {
		return false, false
	}
	return true, e.fault
}

// learn takes what another replica noted of fp (readAhead).
func (l *faultLedger) learn(fp fingerprint, e *faultEntry, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur := l.m[fp]; cur != nil && cur.until > now && (cur.fault || !e.fault) {
		return
	}
	l.put(fp, e, now)
}

// put stores e (l.mu held), dropping expired entries, then any, past the
// bound.
func (l *faultLedger) put(fp fingerprint, e *faultEntry, now int64) {
	if len(l.m) >= maxLedger {
		for k, v := range l.m {
			if v.until <= now {
				delete(l.m, k)
			}
		}
		for k := range l.m {
			if len(l.m) < maxLedger {
				break
			}
			delete(l.m, k)
		}
	}
	l.m[fp] = e
}

// noteName is fp's note in the store.
func noteName(fp fingerprint) string { return "rf:" + hex.EncodeToString(fp[:]) }

// noteValue is what the note holds: "x" (a request fault) or "f" (failed
// once), the answer, and the route.
func noteValue(e *faultEntry) []byte {
	kind := "f"
	if e.fault {
		kind = "x"
	}
	return []byte(kind + "|" + e.sig + "|" + e.route)
}

func parseNote(v []byte, now, ttl int64) (*faultEntry, bool) {
	parts := strings.SplitN(string(v), "|", 3)
	if len(parts) != 3 || (parts[0] != "f" && parts[0] != "x") {
		return nil, false
	}
	return &faultEntry{fault: parts[0] == "x", sig: parts[1], route: parts[2], until: now + ttl, logged: parts[0] == "x"}, true
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
			if ok || err != nil || (!e.fault && cur != nil) {
				return // written; or the store failed; or a note is there already
			}
			prev = cur
		}
	}()
}

// readAhead reads fp's note from the store off the request path, into
// the ledger; the channel closes when it is done (nil: too many reads
// under way, none started).
func (s *Server) readAhead(fp fingerprint, ttl time.Duration) <-chan struct{} {
	select {
	case s.faults.shares <- struct{}{}:
	default:
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { <-s.faults.shares }()
		s.readNote(fp, ttl)
	}()
	return done
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
		s.faults.learn(fp, e, now)
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
	ok := s.WindowCalls - s.WindowFailures
	return ok > 0 && 2*ok >= s.WindowCalls
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
	fault, first := s.faults.judge(st.fp, sig, st.chosen.Key, st.again(), now, ttl, guard)
	e := faultEntry{sig: sig, route: st.chosen.Key, fault: fault}
	s.share(st.fp, e, time.Duration(ttl))
	if !fault {
		return res
	}
	s.metrics.RequestFaults.WithLabelValues(st.gw.ID, st.modelName).Inc()
	if first {
		s.log.Warn("[request_fault] one request's failures are its own, not the route's: they count for no route while it is remembered",
			"gateway", st.gw.ID, "model", st.modelName, "route", st.chosen.Key, "answer", sig,
			"fingerprint", st.fp.short(), "remembered_sec", p.RequestFaultTTLSec)
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
		st.fp = st.s.faults.of("body", st.gw.ID, st.modelName, body)
	case st.hasIdem:
		st.fp = st.s.faults.of("idem", st.gw.ID, st.modelName, st.idem[:])
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
	known, fault := st.s.faults.has(st.fp, now)
	if !fault && !st.again() {
		return false
	}
	st.faultJudged = true
	ttl := time.Duration(st.chosen.Policy.RequestFaultTTLSec) * time.Second
	if st.s.storeInProcess {
		if !known {
			st.s.readNote(st.fp, ttl)
		}
		st.keyRecord(&res)
		res = st.requestFault(res, now, true)
		st.applyJudged(res, now, withMeta)
		return true
	}
	st.s.faults.aside(func() {
		if !known {
			if read := st.s.readAhead(st.fp, ttl); read != nil {
				<-read
			}
		}
		st.keyRecord(&res)
		res = st.requestFault(res, now, true)
		st.applyJudged(res, now, false)
	})
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
