package judge

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"sync"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Request faults (SPEC R-FD4): the ledger of failed fingerprints, shared
// by the live roles (pkg/processor, which adds the fleet's notes) and by
// replay (R-FD5), so that both judge one request's failures alike.
//
// A request's fingerprint is a keyed hash (the fleet's token key) of its
// gateway, model and body, or of its idempotency key when fusebox did not
// read the body; never the body itself, and never written in clear. When
// the same fingerprint fails again with the same answer (a client's retry,
// or the same request sent again) while each route involved answers other
// requests (the guard), the failure is the request's, and the fingerprint
// is remembered as a fault for the TTL, so that its later failures are the
// request's too.

// Fingerprint names one request's content, keyed.
type Fingerprint [16]byte

// Short is the fingerprint's log form (8 hex digits).
func (f Fingerprint) Short() string { return hex.EncodeToString(f[:4]) }

// Logged is the form the access log line carries (16 hex digits: 64 bits
// tell the requests of ten minutes apart).
func (f Fingerprint) Logged() string { return hex.EncodeToString(f[:8]) }

// ParseLogged reads Logged's form back; false for anything else.
func ParseLogged(s string) (Fingerprint, bool) {
	var f Fingerprint
	if len(s) != 16 {
		return f, false
	}
	if _, err := hex.Decode(f[:8], []byte(s)); err != nil {
		return Fingerprint{}, false
	}
	return f, true
}

// AnswersOthers is the guard's test of a route by its breaker's status:
// its successes are at least half of its outcomes in the rate window (an
// outage, which fails every request, never passes).
func AnswersOthers(s breaker.Status) bool {
	ok := s.WindowCalls - s.WindowFailures
	return ok > 0 && 2*ok >= s.WindowCalls
}

// FaultEntry is what the ledger knows of a fingerprint.
type FaultEntry struct {
	Sig    string // the failed answer ("503", or a reason without a status)
	Route  string // the route it first failed on
	Fault  bool   // judged the request's own
	Until  int64  // unix ns: forgotten after
	Logged bool   // its one log line is written
}

// FaultLedger is one replica's memory of failed fingerprints, bounded.
type FaultLedger struct {
	key []byte
	mu  sync.Mutex
	m   map[Fingerprint]*FaultEntry
}

// maxLedger bounds the fingerprints a ledger remembers.
const maxLedger = 1 << 14

// NewFaultLedger keys fingerprints with tokenKey (random when empty).
func NewFaultLedger(tokenKey []byte) *FaultLedger {
	k := tokenKey
	if len(k) == 0 {
		k = make([]byte, 32)
		_, _ = rand.Read(k)
	}
	h := sha256.Sum256(append([]byte("fusebox request fingerprint\x00"), k...))
	return &FaultLedger{key: h[:], m: map[Fingerprint]*FaultEntry{}}
}

// Of is the fingerprint of a request's content (kind "body") or of its
// idempotency key (kind "idem") on gateway gw for model. The content is
// summed by two CRC-32s (Castagnoli and IEEE, both in hardware: an 8 KiB
// body costs 0.5 µs where SHA-256 over it cost 5 µs, and a 1 MiB prompt
// would have cost 0.6 ms on the decision path), and the keyed SHA-256 of
// the sums, the length and the names is the fingerprint: 64 bits of
// content are plenty to tell apart the requests of ten minutes, and
// nothing of the content is kept.
func (l *FaultLedger) Of(kind, gw, model string, content []byte) Fingerprint {
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
	var f Fingerprint
	copy(f[:], sum[:])
	return f
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Judge decides one upstream failure of fp (answer sig, on route) at now:
// fault when fp is remembered as a request fault, or failed before with
// the same answer and this request was sent again, and guard passes every
// route involved; first when this call made it one (its log line is due).
func (l *FaultLedger) Judge(fp Fingerprint, sig, route string, again bool, now, ttl int64, guard func(route string) bool) (fault, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[fp]
	if e != nil && e.Until <= now {
		delete(l.m, fp)
		e = nil
	}
	switch {
	case e != nil && e.Fault:
		if !guard(route) {
			return false, false
		}
		e.Until = now + ttl
		return true, false
	case e != nil && e.Sig == sig && again:
		if !guard(route) || (e.Route != route && !guard(e.Route)) {
			return false, false
		}
		e.Fault, e.Until = true, now+ttl
		first = !e.Logged
		e.Logged = true
		return true, first
	}
	l.put(fp, &FaultEntry{Sig: sig, Route: route, Until: now + ttl}, now)
	return false, false
}

// Has reports whether the ledger remembers fp (a failure or a fault), and
// whether as a fault.
func (l *FaultLedger) Has(fp Fingerprint, now int64) (known, fault bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[fp]
	if e == nil || e.Until <= now {
		return false, false
	}
	return true, e.Fault
}

// Learn takes what another replica noted of fp.
func (l *FaultLedger) Learn(fp Fingerprint, e *FaultEntry, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur := l.m[fp]; cur != nil && cur.Until > now && (cur.Fault || !e.Fault) {
		return
	}
	l.put(fp, e, now)
}

// put stores e (l.mu held), dropping expired entries, then any, past the
// bound.
func (l *FaultLedger) put(fp Fingerprint, e *FaultEntry, now int64) {
	if len(l.m) >= maxLedger {
		for k, v := range l.m {
			if v.Until <= now {
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
