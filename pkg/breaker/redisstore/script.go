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

// arg is one named argument of a script call (R-ST16): breaker.lua reads
// its call as a map, A.<name>.
type arg struct {
	name string
	v    any
}

// args are a call's named arguments, in the order they are encoded.
type args []arg

// get is the value of name, nil when absent.
func (a args) get(name string) any {
	for _, x := range a {
		if x.name == name {
			return x.v
		}
	}
	return nil
}

// policyArgs packs the policy as the script's first argument: a
// MessagePack map read as P, built once per config load. Only what the
// script reads: slow calls are judged in Go (Policy.Judge), and the
// policy's version travels with the outcome, not the state.
func policyArgs(p *breaker.Policy) string {
	// A breaker's state outlives its windows and cooldowns; it expires a
	// day after its last change.
	ttl := int64(24 * time.Hour / time.Millisecond)
	return string(msgpackMap(args{
		{"active", p.Active()}, {"shadow", p.Mode == breaker.ModeShadow},
		{"failure_threshold", p.FailureThreshold}, {"window_sec", p.WindowSec}, {"cooldown_ms", p.CooldownMs},
		{"sliding", p.Window == breaker.WindowSliding}, {"consecutive_failures", p.ConsecutiveFailures},
		{"failure_rate_percent", p.FailureRatePercent}, {"rate_window_sec", p.RateWindowSec},
		{"minimum_requests", p.MinimumRequests},
		{"slow_call_rate_percent", p.SlowCallRatePercent}, {"half_open_max_probes", p.HalfOpenMaxProbes},
		{"probe_timeout_ms", p.ProbeTimeoutMs}, {"backoff_multiplier", p.BackoffMultiplier},
		{"max_cooldown_ms", p.MaxCooldownMs}, {"ttl_ms", ttl},
		{"tracks_slow", p.TracksSlow()}, {"stall_ms", p.StallMs}, {"local_origin_quorum", p.LocalOriginQuorum},
	}))
}

// msgpackMap encodes a map of named bools, integers, floats and strings:
// all the scripts take, without a dependency.
func msgpackMap(a args) []byte {
	b := []byte{0xde, byte(len(a) >> 8), byte(len(a))}
	for _, x := range a {
		b = msgpackValue(msgpackString(b, x.name), x.v)
	}
	return b
}

func msgpackString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = append(b, 0xdb)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
	}
	return append(b, s...)
}

func msgpackValue(b []byte, v any) []byte {
	switch x := v.(type) {
	case bool:
		if x {
			return append(b, 0xc3)
		}
		return append(b, 0xc2)
	case int:
		return msgpackValue(b, int64(x))
	case uint64:
		return msgpackValue(b, int64(x))
	case int64:
		b = append(b, 0xd3)
		return binary.BigEndian.AppendUint64(b, uint64(x))
	case float64:
		b = append(b, 0xcb)
		return binary.BigEndian.AppendUint64(b, math.Float64bits(x))
	case string:
		return msgpackString(b, x)
	case []byte:
		return msgpackString(b, string(x))
	case []string:
		b = append(b, 0xdd)
		b = binary.BigEndian.AppendUint32(b, uint32(len(x)))
		for _, s := range x {
			b = msgpackString(b, s)
		}
		return b
	}
	panic(fmt.Sprintf("redisstore: a script argument of type %T", v))
}

// snapshot is the decision state of a reply, for the local view.
func (r *result) snapshot() breaker.Snapshot {
	return breaker.Snapshot{
		State: breaker.State(r.State), Generation: r.Gen, Reason: r.Reason, OpenedAt: r.OpenedAt * ms, ReopenedAt: r.ReopenedAt * ms,
		Reopens: r.Reopens, OpenUntil: r.OpenUntil * ms, Forced: r.Forced == 1, ForcedUntil: r.ForcedUntil * ms, BlockedUntil: r.BlockedUntil * ms,
		Probes: r.Leases, ProbesUntil: r.Earliest * ms, ClosedAt: r.ClosedAt * ms, SaturatedUntil: r.SaturatedUntil * ms,
		SaturatedSince: r.SaturatedSince * ms,
	}
}

const ms = int64(time.Millisecond)

// result is what the script returns.
type result struct {
	OK, Stale, State, Reopens, Forced, Consecutive, Failures, Leases int
	Lease, Gen                                                       uint64
	Reason                                                           string
	// Times in unix ms (Redis's clock); Earliest is the first probe
	// lease's expiry.
	OpenedAt, ReopenedAt, OpenUntil, ForcedUntil, BlockedUntil, Earliest int64
	// The rate window's totals.
	Calls, Fails, Slow int64
	// ClosedAt is the half_open→closed a recovery ramp runs from (ms; 0 none).
	ClosedAt int64
	// SaturatedUntil: the route's quota headroom is below its floors
	// until then (ms; 0 none; R-H2).
	SaturatedUntil int64
	// Already: a keyed record whose key was applied before (R-DL11); it
	// changed nothing.
	Already bool
	// SaturatedSince: when the saturation began (ms; R-H7).
	SaturatedSince int64
	// Seq is the view sequence: it grows with every change of the decision
	// state; Changed says this call changed it.
	Seq     uint64
	Changed bool
	// Rewritten: the key held a state the script could not read, and it
	// wrote a fresh one (its sequence starts again).
	Rewritten bool
	// Inc is the key's incarnation: another one means the key vanished and
	// was created again (its sequence started again).
	Incarnation string
	Events      []event
}

type event struct {
	From, To, Failures, Forever, Reopens int
	Reason                               string
	OpenUntil, OpenedAt, Calls, Fails    int64
	Gen                                  uint64
	// Sat is 1 for a saturation that starts, 2 for one that ends, 0 for a
	// transition; SatUntil the start's end (ms).
	Sat      int
	SatUntil int64
}

// The script's flat reply, by name: replyNames' fields in that order, then
// eventNames' for each transition. breaker.lua builds it from the same
// lists (REPLY, EVENT); TestReplyProtocolNames holds them equal.
var (
	replyNames = []string{"ok", "lease", "stale", "state", "gen", "reason", "opened_at", "reopened_at", "reopens",
		"open_until", "forced", "forced_until", "blocked_until", "consecutive", "failures", "window_calls",
		"window_failures", "window_slow", "probes", "probes_until", "seq", "changed", "rewritten", "incarnation",
		"closed_at", "saturated_until", "already", "saturated_since"}
	eventNames = []string{"from", "to", "reason", "failures", "open_until", "forever", "opened_at", "reopens",
		"window_calls", "window_failures", "gen", "sat", "sat_until"}
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
	rSaturatedUntil
	rAlready
	rSaturatedSince
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
	eSat
	eSatUntil
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
		OK: int(i(rOK)), Lease: uint64(i(rLease)), Stale: int(i(rStale)), State: int(i(rState)), Gen: uint64(i(rGen)),
		Reason: asString(vals[rReason]), OpenedAt: i(rOpenedAt), ReopenedAt: i(rReopenedAt), Reopens: int(i(rReopens)), OpenUntil: i(rOpenUntil),
		Forced: int(i(rForced)), ForcedUntil: i(rForcedUntil), BlockedUntil: i(rBlockedUntil), Consecutive: int(i(rConsecutive)),
		Failures: int(i(rFailures)), Calls: i(rWindowCalls), Fails: i(rWindowFailures), Slow: i(rWindowSlow),
		Leases: int(i(rProbes)), Earliest: i(rProbesUntil), Seq: uint64(i(rSeq)), Changed: i(rChanged) == 1,
		Rewritten: i(rRewritten) == 1, Incarnation: asString(vals[rIncarnation]), ClosedAt: i(rClosedAt),
		SaturatedUntil: i(rSaturatedUntil), Already: i(rAlready) == 1,
		SaturatedSince: i(rSaturatedSince),
	}
	for k := replyFields; k < len(vals); k += eventFields {
		e := func(j int) int64 { return asInt(vals[k+j]) }
		r.Events = append(r.Events, event{From: int(e(eFrom)), To: int(e(eTo)), Reason: asString(vals[k+eReason]),
			Failures: int(e(eFailures)), OpenUntil: e(eOpenUntil), Forever: int(e(eForever)), OpenedAt: e(eOpenedAt), Reopens: int(e(eReopens)),
			Calls: e(eWindowCalls), Fails: e(eWindowFailures), Gen: uint64(e(eGen)), Sat: int(e(eSat)), SatUntil: e(eSatUntil)})
	}
	return r, nil
}
