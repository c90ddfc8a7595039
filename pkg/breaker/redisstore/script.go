package redisstore

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/redis/go-redis/v9"
)

//go:embed breaker.lua
var scriptSrc string

var script = redis.NewScript(scriptSrc)

// policyArgs packs the policy as the script's third argument: a
// MessagePack array in the order breaker.lua reads it, built once per
// config load.
func policyArgs(p *breaker.Policy) []any {
	// A breaker's state outlives its windows and cooldowns; it expires a
	// day after its last change.
	ttl := int64(24 * time.Hour / time.Millisecond)
	vals := []any{
		p.Active(), p.Mode == breaker.ModeShadow, int64(p.FailureThreshold), int64(p.WindowSec), p.CooldownMs,
		p.Window == breaker.WindowSliding, int64(p.ConsecutiveFailures), p.FailureRatePercent, int64(p.RateWindowSec),
		int64(p.MinimumRequests), p.SlowCallMs, p.SlowCallRatePercent, int64(p.HalfOpenMaxProbes), p.ProbeTimeoutMs,
		p.BackoffMultiplier, p.MaxCooldownMs, p.Version, ttl, p.TracksSlow(), p.StallMs,
	}
	return []any{string(msgpackArray(vals))}
}

// msgpackArray encodes bools, int64s, float64s and short strings: all the
// policy needs, without a dependency.
func msgpackArray(vals []any) []byte {
	b := []byte{0xdc, byte(len(vals) >> 8), byte(len(vals))}
	for _, v := range vals {
		switch x := v.(type) {
		case bool:
			if x {
				b = append(b, 0xc3)
			} else {
				b = append(b, 0xc2)
			}
		case int64:
			b = append(b, 0xd3)
			b = binary.BigEndian.AppendUint64(b, uint64(x))
		case float64:
			b = append(b, 0xcb)
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(x))
		case string:
			b = append(b, 0xd9, byte(len(x)))
			b = append(b, x[:min(len(x), 255)]...)
		}
	}
	return b
}

// snapshot is the decision state of a reply, for the local view.
func (r *result) snapshot() breaker.Snapshot {
	return breaker.Snapshot{
		State: breaker.State(r.St), Generation: r.Gen, Reason: r.Reason, OpenedAt: r.OA * ms, ReopenedAt: r.RA * ms,
		Reopens: r.RC, OpenUntil: r.OU * ms, Forced: r.FO == 1, ForcedUntil: r.FU * ms, BlockedUntil: r.BU * ms,
		Probes: r.Leases, ProbesUntil: r.Earliest * ms, ClosedAt: r.CA * ms,
	}
}

const ms = int64(time.Millisecond)

// result is what the script returns.
type result struct {
	OK, Stale, St, RC, FO, Cons, Failures, Leases    int
	Lease, Gen                                       uint64
	Reason                                           string
	OA, RA, OU, FU, BU, Calls, Fails, Slow, Earliest int64
	// CA is the half_open→closed a recovery ramp runs from (ms; 0 none).
	CA int64
	// V is the view sequence: it grows with every change of the decision
	// state; Changed says this call changed it.
	V       uint64
	Changed bool
	// Rewritten: the key held a state the script could not read, and it
	// wrote a fresh one (its sequence starts again).
	Rewritten bool
	// Inc is the key's incarnation: another one means the key vanished and
	// was created again (its sequence started again).
	Inc    string
	Events []event
}

type event struct {
	From, To, Failures, Forever, RC int
	Reason                          string
	OU, OA, Calls, Fails            int64
	Gen                             uint64
}

// The script's flat reply, by name: replyNames' fields in that order, then
// eventNames' for each transition. breaker.lua builds it from the same
// lists (REPLY, EVENT); TestReplyProtocolNames holds them equal.
var (
	replyNames = []string{"ok", "lease", "stale", "state", "gen", "reason", "opened_at", "reopened_at", "reopens",
		"open_until", "forced", "forced_until", "blocked_until", "consecutive", "failures", "window_calls",
		"window_failures", "window_slow", "probes", "probes_until", "seq", "changed", "rewritten", "incarnation",
		"closed_at"}
	eventNames = []string{"from", "to", "reason", "failures", "open_until", "forever", "opened_at", "reopens",
		"window_calls", "window_failures", "gen"}
)

// Positions of replyNames and eventNames.
const (
	rOK = iota
	rLease
	rStale
	rState
	rGen
	rReason
	rOpenedAt
	rReopenedAt
	rReopens
	rOpenUntil
	rForced
	rForcedUntil
	rBlockedUntil
	rConsecutive
	rFailures
	rWindowCalls
	rWindowFailures
	rWindowSlow
	rProbes
	rProbesUntil
	rSeq
	rChanged
	rRewritten
	rIncarnation
	rClosedAt
	replyFields
)

const (
	eFrom = iota
	eTo
	eReason
	eFailures
	eOpenUntil
	eForever
	eOpenedAt
	eReopens
	eWindowCalls
	eWindowFailures
	eGen
	eventFields
)

func asInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func asString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// replyError is a script reply of the wrong shape: that key's problem, not
// Redis being unreachable.
type replyError struct{ n int }

func (e *replyError) Error() string { return fmt.Sprintf("redisstore: a reply of %d values", e.n) }

// parseReply reads the script's flat reply.
func parseReply(vals []any) (*result, error) {
	if len(vals) < replyFields || (len(vals)-replyFields)%eventFields != 0 {
		return nil, &replyError{n: len(vals)}
	}
	i := func(k int) int64 { return asInt(vals[k]) }
	r := &result{
		OK: int(i(rOK)), Lease: uint64(i(rLease)), Stale: int(i(rStale)), St: int(i(rState)), Gen: uint64(i(rGen)),
		Reason: asString(vals[rReason]), OA: i(rOpenedAt), RA: i(rReopenedAt), RC: int(i(rReopens)), OU: i(rOpenUntil),
		FO: int(i(rForced)), FU: i(rForcedUntil), BU: i(rBlockedUntil), Cons: int(i(rConsecutive)),
		Failures: int(i(rFailures)), Calls: i(rWindowCalls), Fails: i(rWindowFailures), Slow: i(rWindowSlow),
		Leases: int(i(rProbes)), Earliest: i(rProbesUntil), V: uint64(i(rSeq)), Changed: i(rChanged) == 1,
		Rewritten: i(rRewritten) == 1, Inc: asString(vals[rIncarnation]), CA: i(rClosedAt),
	}
	for k := replyFields; k < len(vals); k += eventFields {
		e := func(j int) int64 { return asInt(vals[k+j]) }
		r.Events = append(r.Events, event{From: int(e(eFrom)), To: int(e(eTo)), Reason: asString(vals[k+eReason]),
			Failures: int(e(eFailures)), OU: e(eOpenUntil), Forever: int(e(eForever)), OA: e(eOpenedAt), RC: int(e(eReopens)),
			Calls: e(eWindowCalls), Fails: e(eWindowFailures), Gen: uint64(e(eGen))})
	}
	return r, nil
}
