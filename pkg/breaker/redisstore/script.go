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
		Probes: r.Leases, ProbesUntil: r.Earliest * ms,
	}
}

const ms = int64(time.Millisecond)

// result is what the script returns.
type result struct {
	OK, Stale, St, RC, FO, Cons, Failures, Leases    int
	Lease, Gen                                       uint64
	Reason                                           string
	OA, RA, OU, FU, BU, Calls, Fails, Slow, Earliest int64
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

const replyFields, eventFields = 24, 11

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
		OK: int(i(0)), Lease: uint64(i(1)), Stale: int(i(2)), St: int(i(3)), Gen: uint64(i(4)), Reason: asString(vals[5]),
		OA: i(6), RA: i(7), RC: int(i(8)), OU: i(9), FO: int(i(10)), FU: i(11), BU: i(12), Cons: int(i(13)),
		Failures: int(i(14)), Calls: i(15), Fails: i(16), Slow: i(17), Leases: int(i(18)), Earliest: i(19),
		V: uint64(i(20)), Changed: i(21) == 1, Rewritten: i(22) == 1, Inc: asString(vals[23]),
	}
	for k := replyFields; k < len(vals); k += eventFields {
		e := func(j int) int64 { return asInt(vals[k+j]) }
		r.Events = append(r.Events, event{From: int(e(0)), To: int(e(1)), Reason: asString(vals[k+2]), Failures: int(e(3)),
			OU: e(4), Forever: int(e(5)), OA: e(6), RC: int(e(7)), Calls: e(8), Fails: e(9), Gen: uint64(e(10))})
	}
	return r, nil
}
