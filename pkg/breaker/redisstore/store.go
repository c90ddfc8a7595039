package redisstore

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/redis/go-redis/v9"
)

//go:embed breaker.lua
var scriptSrc string

var script = redis.NewScript(scriptSrc)

// Options configure a Store.
type Options struct {
	Client    redis.UniversalClient
	KeyPrefix string
	// OpTimeout bounds every Redis call (op_timeout_ms); 0 = 50 ms.
	OpTimeout time.Duration
	// OnEvent receives every transition a script of this replica made.
	OnEvent func(breaker.Event)
}

// Store is the Redis breaker.Store.
type Store struct {
	rdb     redis.UniversalClient
	prefix  string
	timeout time.Duration
	onEvent func(breaker.Event)

	mu  sync.Mutex
	tab atomic.Pointer[table]
}

type table struct {
	byID map[breaker.ID]*entry
}

// entry is one installed breaker: its policy, its key, and this replica's
// view of its state (refreshed by every script result).
type entry struct {
	id     breaker.ID
	key    string
	policy *breaker.Policy
	args   []any // the policy as script arguments

	view atomic.Pointer[result]
	// lastNow is the clock of the latest call: Release has no clock of its
	// own and must not mix another one in.
	lastNow atomic.Int64
	// emitMu orders this replica's calls on the breaker, so transition
	// events are reported in the order the scripts made them.
	emitMu sync.Mutex
}

// New returns a Store on opts.Client.
func New(opts Options) *Store {
	s := &Store{rdb: opts.Client, prefix: opts.KeyPrefix, timeout: opts.OpTimeout, onEvent: opts.OnEvent}
	if s.timeout <= 0 {
		s.timeout = 50 * time.Millisecond
	}
	s.tab.Store(&table{byID: map[breaker.ID]*entry{}})
	return s
}

// Key returns the Redis key of a breaker: the prefix, then the breaker's
// identity as a hash tag so that all its keys live in one Cluster slot.
func (s *Store) Key(id breaker.ID) string {
	return s.prefix + "{" + id.Gateway + "|" + id.Route + "}:state"
}

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

// Install implements breaker.Store. Policies live in each replica's config;
// Redis holds only state, so installing writes nothing.
func (s *Store) Install(_ context.Context, _ int64, specs []breaker.Spec) ([]breaker.Key, []breaker.ID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.tab.Load()
	nt := &table{byID: make(map[breaker.ID]*entry, len(specs))}
	keys := make([]breaker.Key, len(specs))
	for i, sp := range specs {
		if sp.Policy == nil {
			return nil, nil, fmt.Errorf("redisstore: install %s: no policy", sp.ID.Route)
		}
		if _, ok := nt.byID[sp.ID]; !ok {
			e := &entry{id: sp.ID, key: s.Key(sp.ID), policy: sp.Policy, args: policyArgs(sp.Policy)}
			if prev, kept := old.byID[sp.ID]; kept {
				e.view.Store(prev.view.Load())
			}
			nt.byID[sp.ID] = e
		}
		keys[i] = breaker.KeyOf(sp.ID)
	}
	var removed []breaker.ID
	for id := range old.byID {
		if _, ok := nt.byID[id]; !ok {
			removed = append(removed, id)
		}
	}
	s.tab.Store(nt)
	return keys, removed, nil
}

func (s *Store) get(k breaker.Key) (*entry, error) {
	if e, ok := s.tab.Load().byID[k.ID()]; ok {
		return e, nil
	}
	return nil, breaker.ErrUnknown
}

// result is what the script returns.
type result struct {
	OK, Stale, St, RC, FO, Cons, Failures, Leases    int
	Lease, Gen                                       uint64
	Reason                                           string
	OA, RA, OU, FU, BU, Calls, Fails, Slow, Earliest int64
	Events                                           []event
}

type event struct {
	From, To, Failures, Forever, RC int
	Reason                          string
	OU, OA, Calls, Fails            int64
	Gen                             uint64
}

const replyFields, eventFields = 20, 11

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

// parseReply reads the script's flat reply.
func parseReply(vals []any) (*result, error) {
	if len(vals) < replyFields || (len(vals)-replyFields)%eventFields != 0 {
		return nil, fmt.Errorf("redisstore: a reply of %d values", len(vals))
	}
	i := func(k int) int64 { return asInt(vals[k]) }
	r := &result{
		OK: int(i(0)), Lease: uint64(i(1)), Stale: int(i(2)), St: int(i(3)), Gen: uint64(i(4)), Reason: asString(vals[5]),
		OA: i(6), RA: i(7), RC: int(i(8)), OU: i(9), FO: int(i(10)), FU: i(11), BU: i(12), Cons: int(i(13)),
		Failures: int(i(14)), Calls: i(15), Fails: i(16), Slow: i(17), Leases: int(i(18)), Earliest: i(19),
	}
	for k := replyFields; k < len(vals); k += eventFields {
		e := func(j int) int64 { return asInt(vals[k+j]) }
		r.Events = append(r.Events, event{From: int(e(0)), To: int(e(1)), Reason: asString(vals[k+2]), Failures: int(e(3)),
			OU: e(4), Forever: int(e(5)), OA: e(6), RC: int(e(7)), Calls: e(8), Fails: e(9), Gen: uint64(e(10))})
	}
	return r, nil
}

const ms = int64(time.Millisecond)

// run calls the script for e and refreshes the local view; transitions are
// reported in order.
func (s *Store) run(ctx context.Context, e *entry, op string, now int64, extra ...any) (*result, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	args := make([]any, 0, 2+len(e.args)+len(extra))
	args = append(args, op, now/ms)
	args = append(args, e.args...)
	args = append(args, extra...)
	e.emitMu.Lock()
	defer e.emitMu.Unlock()
	e.lastNow.Store(now)
	vals, err := script.Run(ctx, s.rdb, []string{e.key}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redisstore %s %s: %w", op, e.id.Route, err)
	}
	r, err := parseReply(vals)
	if err != nil {
		return nil, err
	}
	e.view.Store(r)
	if s.onEvent != nil {
		for _, ev := range r.Events {
			s.onEvent(s.event(e, ev, now))
		}
	}
	return r, nil
}

func (s *Store) event(e *entry, ev event, now int64) breaker.Event {
	out := breaker.Event{
		ID: e.id, Provider: e.id.Provider(), From: breaker.State(ev.From), To: breaker.State(ev.To), Reason: ev.Reason,
		At: now, Failures: ev.Failures, Threshold: e.policy.FailureThreshold, PolicyVersion: e.policy.Version,
		OpenUntil: ev.OU * ms, OpenedAt: ev.OA * ms, Reopens: ev.RC, WindowCalls: ev.Calls, WindowFailures: ev.Fails,
		Generation: ev.Gen,
	}
	if ev.Forever == 1 && ev.To == int(breaker.Open) {
		out.OpenUntil = breaker.Never
	}
	return out
}

// Peek implements breaker.Store from this replica's view: no round trip
// (R-ST2). A due transition (open past its cooldown) reads as half-open.
func (s *Store) Peek(_ context.Context, k breaker.Key, now int64) breaker.Verdict {
	e, err := s.get(k)
	if err != nil {
		return breaker.Verdict{Allowed: true}
	}
	p := e.policy
	if !p.Active() {
		return breaker.Verdict{Allowed: true, Off: true}
	}
	v := breaker.Verdict{Shadow: p.Mode == breaker.ModeShadow}
	r := e.view.Load()
	if r == nil {
		v.Allowed = true
		return v
	}
	v.State, v.Forced, v.Blocked = breaker.State(r.St), r.FO == 1, r.BU*ms > now
	var rec int64
	switch {
	case r.FO == 1:
		rec = breaker.Never
		if r.FU != 0 {
			rec = r.FU * ms
		}
		if r.FU != 0 && now >= r.FU*ms {
			rec, v.Forced, v.State = 0, false, breaker.Closed
		}
	case r.St == int(breaker.Open) && now < r.OU*ms:
		rec = r.OU * ms
	case r.St == int(breaker.Open):
		v.State = breaker.HalfOpen // due: the next acquire makes it so
	case r.St == int(breaker.HalfOpen) && p.HalfOpenMaxProbes > 0 && r.Leases >= p.HalfOpenMaxProbes && r.Earliest*ms > now:
		v.ProbesFull, rec = true, r.Earliest*ms
	}
	if v.Blocked && r.BU*ms > rec && rec != breaker.Never {
		rec = r.BU * ms
	}
	v.RecoveryAt = rec
	v.Allowed = rec == 0
	return v
}

// Acquire implements breaker.Store. A healthy view admits with no round
// trip; otherwise one script call takes the probe slot, so the bound holds
// across replicas.
func (s *Store) Acquire(ctx context.Context, k breaker.Key, now int64, force bool) (breaker.Admission, bool, error) {
	e, err := s.get(k)
	if err != nil {
		return breaker.Admission{}, true, err
	}
	if !e.policy.Active() {
		return breaker.Admission{}, true, nil
	}
	if r := e.view.Load(); r == nil || (r.St == 0 && r.FO == 0 && r.BU*ms <= now) {
		gen := uint64(1)
		if r != nil {
			gen = r.Gen
		}
		if r != nil || e.policy.Mode == breaker.ModeShadow {
			return breaker.Admission{Gen: gen}, true, nil
		}
	}
	r, err := s.run(ctx, e, "acq", now, b01(force))
	if err != nil {
		// R-ST2: on error the replica admits on its own.
		return breaker.Admission{Gen: 0}, true, err
	}
	return breaker.Admission{Gen: r.Gen, Lease: r.Lease}, r.OK == 1, nil
}

func b01(v bool) string {
	if v {
		return "1"
	}
	return "0"
}

// Release implements breaker.Store.
func (s *Store) Release(ctx context.Context, k breaker.Key, adm breaker.Admission) error {
	if adm.Lease == 0 {
		return nil
	}
	e, err := s.get(k)
	if err != nil {
		return err
	}
	now := e.lastNow.Load()
	if now == 0 {
		now = time.Now().UnixNano()
	}
	_, err = s.run(ctx, e, "rel", now, strconv.FormatUint(adm.Lease, 10))
	return err
}

// Record implements breaker.Store: the attempt is judged here with the
// installed policy, and applied by one script call.
func (s *Store) Record(ctx context.Context, k breaker.Key, now int64, adm breaker.Admission, r breaker.Result) (breaker.Recorded, error) {
	e, err := s.get(k)
	if err != nil {
		return breaker.Recorded{}, err
	}
	p := e.policy
	if !p.Active() {
		if adm.Lease != 0 {
			_, _ = s.run(ctx, e, "rel", now, strconv.FormatUint(adm.Lease, 10))
		}
		return breaker.Recorded{}, nil
	}
	o := p.Judge(r)
	class := 0
	switch o.Class {
	case breaker.Success:
		class = 1
	case breaker.Failure:
		class = 2
	}
	ra := int64(0)
	if r.RetryAfterUnixNano != 0 {
		ra = r.RetryAfterUnixNano / ms
	}
	res, err := s.run(ctx, e, "rec", now, class, o.Reason, b01(o.Slow), b01(o.OpenNow), adm.Gen,
		strconv.FormatUint(adm.Lease, 10), ra, b01(e.id.Scope == breaker.ScopeGateway), r.Status,
		b01(p.RetryAfter == breaker.RetryAfterBlock), p.MaxRetryAfterSec, o.SlowBy, b01(o.Counted))
	if err != nil {
		return breaker.Recorded{Outcome: o, Applied: true}, err
	}
	return breaker.Recorded{Outcome: o, Stale: res.Stale == 1, Applied: true}, nil
}

// Stalled implements breaker.Store.
func (s *Store) Stalled(ctx context.Context, k breaker.Key, now int64) error {
	e, err := s.get(k)
	if err == nil {
		_, err = s.run(ctx, e, "stl", now)
	}
	return err
}

// ForceOpen implements breaker.Store.
func (s *Store) ForceOpen(ctx context.Context, k breaker.Key, now int64, d time.Duration) error {
	e, err := s.get(k)
	if err == nil {
		_, err = s.run(ctx, e, "fo", now, int64(d)/ms)
	}
	return err
}

// ForceClose implements breaker.Store.
func (s *Store) ForceClose(ctx context.Context, k breaker.Key, now int64) error {
	e, err := s.get(k)
	if err == nil {
		_, err = s.run(ctx, e, "fc", now)
	}
	return err
}

// Reset implements breaker.Store.
func (s *Store) Reset(ctx context.Context, k breaker.Key, now int64) error {
	e, err := s.get(k)
	if err == nil {
		_, err = s.run(ctx, e, "rst", now)
	}
	return err
}

// Status implements breaker.Store, reading Redis (and making due
// transitions).
func (s *Store) Status(ctx context.Context, k breaker.Key, now int64) (breaker.Status, error) {
	e, err := s.get(k)
	if err != nil {
		return breaker.Status{}, err
	}
	r, err := s.run(ctx, e, "adv", now)
	if err != nil {
		return breaker.Status{}, err
	}
	return statusOf(e, r, now), nil
}

func sec(v int64) *float64 {
	if v == 0 {
		return nil
	}
	f := float64(v) / 1e3
	return &f
}

func statusOf(e *entry, r *result, now int64) breaker.Status {
	st := breaker.Status{
		State: breaker.State(r.St).String(), Failures: r.Failures, OpenedAt: sec(r.OA), ReopenedAt: sec(r.RA),
		Reopens: r.RC, Reason: r.Reason, Scope: e.id.Scope, BlockedUntil: sec(r.BU), ProbesInFlight: r.Leases,
		Forced: r.FO == 1, PolicyVersion: e.policy.Version, WindowCalls: r.Calls, WindowFailures: r.Fails,
		WindowSlowCalls: r.Slow, ConsecutiveFailures: r.Cons, Generation: r.Gen,
	}
	if r.St == int(breaker.Open) && !(r.FO == 1 && r.FU == 0) {
		st.OpenUntil = sec(r.OU)
	}
	st.Notable = r.St != 0 || r.BU*ms > now
	return st
}

// Sweep implements breaker.Store: due transitions of the breakers this
// replica sees as not closed.
func (s *Store) Sweep(ctx context.Context, now int64) error {
	var errs []error
	for _, e := range s.tab.Load().byID {
		r := e.view.Load()
		if r == nil || (r.St == 0 && r.BU == 0 && r.FO == 0) {
			continue
		}
		if _, err := s.run(ctx, e, "adv", now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var _ breaker.Store = (*Store)(nil)
