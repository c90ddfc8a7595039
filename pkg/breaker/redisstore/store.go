package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/fnv"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	replicav1 "github.com/fusebox-llm/fusebox/proto/replica/v1"
	"github.com/redis/go-redis/v9"
)

// Options configure a Store.
type Options struct {
	Client    redis.UniversalClient
	KeyPrefix string
	// OpTimeout bounds every Redis call (op_timeout_ms); 0 = 50 ms.
	OpTimeout time.Duration
	// OnEvent receives every transition this replica made: by a script it
	// ran, or on its local state while Redis was unreachable. Transitions
	// learned from other replicas are not reported (they log and count
	// their own); OnView hears of them.
	OnEvent func(breaker.Event)
	// OnView is told of every state change of the local view learned from
	// Redis (the state gauge follows it).
	OnView func(id breaker.ID, st breaker.State)
	// OnError counts a failed Redis operation (aig_store_errors_total{op}).
	OnError func(op string)
	// OnOverlay is told when another replica changed the admin overlay of
	// a gateway (the config manager reloads the overlays).
	OnOverlay func(gateway string)
	// OnHealth is told when the store becomes ready (first snapshot loaded)
	// and when it turns degraded or recovers (R-ST4).
	OnHealth func(ready, degraded bool, detail string)
	// AsyncRecord makes Record judge the attempt, queue the script call and
	// return at once, off the request's path (R-ST2); Stale is then not
	// reported. The contract suite uses the synchronous form.
	AsyncRecord bool
	// RefreshInterval is the period of the refresh of the local view (the
	// feed's safety net): one read of the change log, then the breakers
	// it names; 0 = 2 s.
	RefreshInterval time.Duration
	// FullRefreshInterval is the period of the refresh that reads every
	// breaker (the change log's own safety net, for a note lost with a
	// replica that died between a change and its note); 0 = 30 min.
	FullRefreshInterval time.Duration
	// Clock drives the background loops; nil = the system clock.
	Clock breaker.Clock
	Log   *slog.Logger
	// ReplicaID names this replica on the feed; "" = random.
	ReplicaID string
	// TestClock makes the scripts take the caller's clock (a test's fake
	// Clock) as now instead of Redis's TIME (R-ST16): the one explicit way
	// a replica's time stands in Redis. Production leaves it false: every
	// replica's cooldowns, leases and windows run on Redis's clock, each
	// call carrying only its event's age.
	TestClock bool
	// HMACKey, when set, signs every feed message and overlay document,
	// and only ones signed with it are read (R-L12, sign.go).
	HMACKey []byte
	// OnRefused counts a feed message or overlay document dropped for a
	// missing or bad signature ("feed_unsigned", "overlay_unsigned",
	// "note_unsigned").
	OnRefused func(what string)
	// OnAlive hears how many replicas share the store, at each beat
	// (members.go).
	OnAlive func(n int)
}

// Store is the Redis breaker.Store. Decisions read a local view (a
// breaker.Memory holding each breaker's decision state, as Redis last said
// it); every script result, feed message and refresh puts Redis's state
// into it. While Redis is unreachable the local view is the store: it
// decides and records on its own, and its opens are written back when
// Redis returns (R-ST4).
type Store struct {
	rdb     redis.UniversalClient
	prefix  string
	feed    string
	timeout time.Duration
	opts    Options
	log     *slog.Logger
	origin  string
	// leaseTag is this replica's tag in its local leases (localSlot).
	leaseTag uint64

	// The local view. Embedded (through an unexported alias) so that Peek,
	// the one method the Store does not define itself, is the memory
	// store's own: the decision pays no extra call or Verdict copy.
	*viewMemory
	local *breaker.Memory
	// eg is this replica's own view of its egress (egress.go).
	eg *egressView
	// sync is the store's phase on its way back to Redis (syncstate.go).
	sync   syncState
	ready  atomic.Bool
	resync atomic.Bool // the feed reconnected: reload every view
	kick   chan struct{}
	// hint wakes the hint loop: a feed message named a breaker whose state
	// changed; its state is read from Redis, never taken from the message.
	hint   chan struct{}
	hintMu sync.Mutex
	hinted []*entry // named by the feed since the hint loop\'s last round
	pub    chan *replicav1.Envelope
	sign   signer
	// changes notes this replica's changes for the others' refresh, and
	// remembers what this replica's last refresh read (changes.go).
	changes *changeLog
	changed chan struct{} // wakes the publish loop to write the notes
	// lastFull is when the last refresh read every breaker (unix ns).
	lastFull atomic.Int64
	// unsignedLogged is when a dropped unsigned message was last logged.
	unsignedLogged atomic.Int64
	rec            []chan recJob
	// writingBack counts the write-backs under way (sendUnsent): their
	// outcomes have left the unsent lists and Redis has not answered them.
	writingBack atomic.Int64
	over        []overflow // each worker\'s jobs past its full queue
	started     atomic.Bool
	// alive is how many replicas beat in the store lately; lastBeat when
	// this one last did (members.go).
	alive    atomic.Int64
	lastBeat atomic.Int64
	// lastHealth is the readiness last reported to OnHealth.
	lastHealth atomic.Int32
	healthMu   sync.Mutex

	// lines orders the local view's transition lines with the lines that
	// begin and end the stretches in which the view is the store ("Redis
	// is unreachable", "reachable again", one breaker's "answered with an
	// error" and "reads again"): a line is written with the phase or flag
	// that admitted it, so a transition the view made as the store is
	// never logged after the line that ends its stretch (#54, the fleet
	// soak reads each stretch as one chain).
	lines sync.RWMutex

	mu  sync.Mutex
	tab atomic.Pointer[table]
}

type table struct {
	byID  map[breaker.ID]*entry
	byKey map[string]*entry // by Redis key: the change log names keys
	list  []*entry
}

// entry is one installed breaker: its Redis key, what the configuration
// sets on it (conf), and this replica's state of it. A reload that keeps
// the breaker keeps its entry and swaps only conf: record jobs in flight
// and answers matched by token hold the entry, and its unanswered and
// unsent outcomes live in it (#54: a reload while Redis was unreachable
// built a new entry, and the failures the old one held were never
// written back).
type entry struct {
	id   breaker.ID
	key  string
	pbID *replicav1.BreakerId
	conf atomic.Pointer[entryConf]

	// view is this replica's view of the breaker (view.go).
	view
	last atomic.Pointer[result]
	// lastNow is the clock of the latest call: Release has no clock of its
	// own and must not mix another one in.
	lastNow atomic.Int64
	// emitMu orders this replica's calls on the breaker, so transition
	// events are reported in the order the scripts made them.
	emitMu sync.Mutex
	// bad: Redis answered this breaker's last call with an error of its own
	// (keyerror.go); it decides and records on the local view until a
	// refresh reads it again. Only this breaker: the store is not degraded.
	bad atomic.Bool
	// hinted: the feed said this breaker changed; the hint loop reads it.
	hinted atomic.Bool
	// behind: Redis answered with a state older than the view's (apply).
	behind atomic.Bool
	// overrideSent: the last write-back of the queue sent an operator's
	// override (settleLocal).
	overrideSent atomic.Bool
}

// entryConf is what one configuration sets on an installed breaker.
type entryConf struct {
	lk        breaker.Key
	egk       breaker.Key // the breaker on the egress view
	policy    *breaker.Policy
	policyArg string // the policy as the script reads it (policyArgs)
}

// lk is the breaker's key in the local view.
func (e *entry) lk() breaker.Key { return e.conf.Load().lk }

// egk is the breaker's key in the egress view.
func (e *entry) egk() breaker.Key { return e.conf.Load().egk }

// policy is the breaker's policy in the configuration installed last.
func (e *entry) policy() *breaker.Policy { return e.conf.Load().policy }

// localLease marks a probe slot taken on the local view while Redis was
// unreachable, so that it is never confused with a Redis lease number.
// Bits 46..61 carry the replica's tag (leaseTag): a local lease travels in
// the failover chain token to other replicas, and only the one that gave
// it may free it (on any other it frees nothing).
const (
	localLease = uint64(1) << 62
	tagShift   = 46
	tagMask    = uint64(0xFFFF) << tagShift
)

// localSlot reports the local view's lease number of a lease this replica
// gave on its local view (ok), else 0: a Redis lease, or another
// replica's local one.
func (s *Store) localSlot(lease uint64) (n uint64, ok bool) {
	if lease&localLease == 0 || lease&tagMask != s.leaseTag {
		return 0, false
	}
	return lease &^ (localLease | tagMask), true
}

// New returns a Store on opts.Client. Start runs its feed and refresh.
func New(opts Options) *Store {
	s := &Store{rdb: opts.Client, prefix: opts.KeyPrefix, timeout: opts.OpTimeout, opts: opts, log: opts.Log,
		origin: opts.ReplicaID, kick: make(chan struct{}, 1), hint: make(chan struct{}, 1), pub: make(chan *replicav1.Envelope, 4096),
		sign: signer{key: opts.HMACKey}, changes: newChangeLog(opts.KeyPrefix),
		changed: make(chan struct{}, 1)}
	s.feed = s.prefix + "feed"
	// The record queues exist from the start: a stream served before Start
	// queues its record (the workers take it once they run) instead of
	// racing Start for the slice.
	s.rec = make([]chan recJob, recordWorkers)
	s.over = make([]overflow, recordWorkers)
	for i := range s.rec {
		s.rec[i] = make(chan recJob, 4096)
	}
	if s.timeout <= 0 {
		s.timeout = 50 * time.Millisecond
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.Clock == nil {
		s.opts.Clock = breaker.SystemClock{}
	}
	if s.opts.RefreshInterval <= 0 {
		s.opts.RefreshInterval = 2 * time.Second
	}
	if s.opts.FullRefreshInterval <= 0 {
		s.opts.FullRefreshInterval = 30 * time.Minute
	}
	if s.origin == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		s.origin = hex.EncodeToString(b[:])
	}
	// The local view reports its own transitions only while it is the
	// store (degraded); otherwise the scripts' transitions are the ones.
	s.local = breaker.NewMemory(func(ev breaker.Event) {
		if s.opts.OnEvent == nil {
			return
		}
		ev.DecidedBy = breaker.DecidedByLocal
		s.lines.RLock()
		defer s.lines.RUnlock()
		if s.sync.localIsTheStore() {
			s.opts.OnEvent(ev)
		} else if e, ok := s.tab.Load().byID[ev.ID]; ok && e.bad.Load() {
			s.opts.OnEvent(ev) // this breaker alone decides locally
		}
	})
	h := fnv.New32a()
	_, _ = h.Write([]byte(s.origin))
	s.leaseTag = uint64(h.Sum32()&0xFFFF) << tagShift
	s.tab.Store(&table{byID: map[breaker.ID]*entry{}, byKey: map[string]*entry{}})
	s.viewMemory = s.local
	s.eg = s.newEgress()
	return s
}

// Key returns the Redis key of a breaker: the prefix, then the breaker's
// identity as a hash tag so that all its keys live in one Cluster slot.
func (s *Store) Key(id breaker.ID) string {
	return s.prefix + "{" + id.Gateway + "|" + id.Route + "}:state"
}

// Install implements breaker.Store. Policies live in each replica's config;
// Redis holds only state, so installing writes nothing. New breakers learn
// their shared state at the next refresh, which Install brings forward.
func (s *Store) Install(ctx context.Context, now int64, specs []breaker.Spec) ([]breaker.Key, []breaker.ID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, removed, err := s.local.Install(ctx, now, specs)
	if err != nil {
		return nil, nil, err
	}
	egks, _, err := s.eg.mem.Install(ctx, now, specs)
	if err != nil {
		return nil, nil, err
	}
	old := s.tab.Load()
	nt := &table{byID: make(map[breaker.ID]*entry, len(specs)), byKey: make(map[string]*entry, len(specs))}
	fresh := false
	for i, sp := range specs {
		if _, ok := nt.byID[sp.ID]; ok {
			continue
		}
		e, kept := old.byID[sp.ID]
		if !kept {
			e = &entry{id: sp.ID, key: s.Key(sp.ID),
				pbID: &replicav1.BreakerId{Gateway: sp.ID.Gateway, Route: sp.ID.Route, Scope: scopeOf(sp.ID.Scope)}}
			fresh = true
		}
		e.conf.Store(&entryConf{lk: keys[i], egk: egks[i], policy: sp.Policy, policyArg: policyArgs(sp.Policy)})
		nt.byID[sp.ID] = e
		nt.byKey[e.key] = e
		nt.list = append(nt.list, e)
	}
	s.tab.Store(nt)
	if fresh {
		s.wake()
	}
	return keys, removed, nil
}

func scopeOf(sc breaker.Scope) replicav1.Scope {
	if sc == breaker.ScopeGlobal {
		return replicav1.Scope_SCOPE_GLOBAL
	}
	return replicav1.Scope_SCOPE_GATEWAY
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Store) get(k breaker.Key) (*entry, error) {
	if e, ok := s.tab.Load().byID[k.ID()]; ok {
		return e, nil
	}
	return nil, breaker.ErrUnknown
}

// remote reports whether e's calls go to Redis: not while Redis is
// unreachable (the store is degraded), nor while Redis answers this breaker
// with an error of its own. The one place the remote/local choice is made.
func (s *Store) remote(e *entry) bool { return !s.sync.localIsTheStore() && !e.bad.Load() }

// Acquire implements breaker.Store. A healthy view admits with no round
// trip; otherwise one script call takes the probe slot, so the bound holds
// across replicas. When Redis is unreachable the local view admits up to
// half_open_max_probes on its own.
func (s *Store) Acquire(ctx context.Context, k breaker.Key, now int64, force bool) (breaker.Admission, bool, error) {
	if s.eg.notClosed.Load() != 0 {
		return s.acquireEgress(ctx, k, now, force)
	}
	return s.acquireShared(ctx, k, now, force)
}

// acquireShared admits by the shared state alone.
func (s *Store) acquireShared(ctx context.Context, k breaker.Key, now int64, force bool) (breaker.Admission, bool, error) {
	// A healthy local view admits on the memory store's own lock-free
	// path: one atomic load, no round trip.
	if adm, ok := breaker.AcquireHealthy(s.local, k); ok {
		return adm, true, nil
	}
	e, err := s.get(k)
	if err != nil {
		return breaker.Admission{}, true, err
	}
	if !s.remote(e) || e.policy().Mode == breaker.ModeShadow {
		return s.acquireLocal(ctx, k, now, force)
	}
	if force {
		// try_all and the capacity floor send to an open route anyway:
		// no slot is at stake, so the view answers with no round trip (a
		// Redis stall never holds such a decision). Only a forced request
		// that would take a free probe slot asks Redis, as any probe does.
		// A view that lags Redis gives an older generation: the outcome is
		// then stale in the script (not counted), never misapplied.
		if adm, ok := breaker.AcquireForced(s.local, k, now); ok {
			return adm, true, nil
		}
	}
	id := newLeaseID()
	r, err := s.run(ctx, e, "acq", now, args{{"force", force}, {"lease_id", id}})
	if err != nil {
		if !keyError(err) {
			// The call may have run in Redis after this side gave up
			// (a timeout): the slot it took is released by its id before
			// the resync reads the breaker back. Before, the slot stayed
			// taken until probe_timeout_ms.
			s.owe(e, recJob{e: e, op: "rel", now: now, args: args{{"lease", id}}})
		}
		adm, ok, _ := s.acquireLocal(ctx, k, now, force)
		return adm, ok, err
	}
	return breaker.Admission{Gen: r.Gen, Lease: r.Lease}, r.OK == 1, nil
}

func (s *Store) acquireLocal(ctx context.Context, k breaker.Key, now int64, force bool) (breaker.Admission, bool, error) {
	adm, ok, err := s.local.Acquire(ctx, k, now, force)
	if adm.Lease != 0 {
		adm.Lease |= localLease | s.leaseTag
	}
	return adm, ok, err
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
	if eadm, _, ok := s.egressAdmission(adm); ok {
		return s.eg.mem.Release(ctx, e.egk(), eadm)
	}
	if adm.Lease&localLease != 0 {
		n, mine := s.localSlot(adm.Lease)
		if !mine {
			return nil // another replica's local slot: nothing here to free
		}
		adm.Lease = n
		return s.local.Release(ctx, e.lk(), adm)
	}
	now := e.lastNow.Load()
	if now == 0 {
		now = s.opts.Clock.Now().UnixNano()
	}
	rel := recJob{e: e, op: "rel", now: now, args: args{{"lease", adm.Lease}}}
	if !s.remote(e) {
		s.owe(e, rel) // released when Redis answers again, before the resync
		return nil
	}
	if _, err = s.run(ctx, e, "rel", now, rel.args); err != nil && !keyError(err) {
		s.owe(e, rel)
	}
	return err
}

// newLeaseID is a probe lease's id in Redis, chosen here so that a call
// whose answer never came can still be released. Random below bit 46: the
// local leases' tag and flag bits stay clear, and Lua's doubles hold it
// exactly.
func newLeaseID() uint64 {
	return mrand.Uint64()&(1<<tagShift-1) | 1
}

// Stalled implements breaker.Store.
func (s *Store) Stalled(ctx context.Context, k breaker.Key, now int64) error {
	e, err := s.get(k)
	if err != nil {
		return err
	}
	if s.remote(e) {
		if _, err = s.run(ctx, e, "stl", now, nil); err == nil {
			return nil
		}
	}
	_ = s.local.Stalled(ctx, e.lk(), now)
	return err
}

// ForceOpen implements breaker.Store. While Redis is unreachable the
// override applies to the local view and is written back on return.
func (s *Store) ForceOpen(ctx context.Context, k breaker.Key, now int64, d time.Duration) error {
	return s.override(ctx, k, now, "fo", func(e *entry) error { return s.local.ForceOpen(ctx, e.lk(), now, d) },
		args{{"duration_ms", int64(d) / ms}})
}

// ForceClose implements breaker.Store.
func (s *Store) ForceClose(ctx context.Context, k breaker.Key, now int64) error {
	return s.override(ctx, k, now, "fc", func(e *entry) error { return s.local.ForceClose(ctx, e.lk(), now) }, nil)
}

// Reset implements breaker.Store.
func (s *Store) Reset(ctx context.Context, k breaker.Key, now int64) error {
	return s.override(ctx, k, now, "rst", func(e *entry) error { return s.local.Reset(ctx, e.lk(), now) }, nil)
}

func (s *Store) override(ctx context.Context, k breaker.Key, now int64, op string, local func(*entry) error, a args) error {
	e, err := s.get(k)
	if err != nil {
		return err
	}
	if op != "fo" {
		// An operator's close or reset ends this replica's own open too.
		_ = s.eg.mem.Reset(ctx, e.egk(), now)
	}
	// The override's id (R-DL11's rule for outcomes, kept for overrides
	// too): Redis applies it once, however often it is sent.
	a = append(a, arg{"id", newRecordID()})
	if s.remote(e) {
		if _, err := s.runAs(ctx, e, op, now, answer{kind: answerOverride, reason: overrideReason[op]}, a); err == nil {
			s.dropQueuedOverrides(e) // a later override supersedes one queued
			return nil
		}
	}
	// Redis did not answer (it may have applied the override all the same:
	// a timeout is not a refusal). The override applies to the local view
	// now and is queued with the outcomes Redis has not taken, in order, to
	// be sent when Redis answers again (R-ST8): the outcomes recorded after
	// it count after it, and a repeat of one Redis ran changes nothing.
	// Before, it was replayed after those outcomes, and ran twice when its
	// answer had only been late: a force-close then wiped out the failures
	// that had opened the route since, on every replica.
	s.owe(e, recJob{e: e, op: op, now: now, args: a})
	return local(e)
}

// overrideReason is the reason of each override's transition.
var overrideReason = map[string]string{"fo": breaker.ReasonForced, "fc": breaker.ReasonForceClose, "rst": breaker.ReasonReset}

// isOverride reports whether op is an operator's override.
func isOverride(op string) bool { _, ok := overrideReason[op]; return ok }

// overrideRanOut reports whether j, a queued force-open with a duration,
// ended before now: it is not sent (the route would open for nothing).
func overrideRanOut(j recJob, now int64) bool {
	d, _ := j.args.get("duration_ms").(int64)
	return j.op == "fo" && d > 0 && j.now/ms+d <= now/ms
}

// Status implements breaker.Store, reading Redis (and making due
// transitions); from the local view while Redis is unreachable.
func (s *Store) Status(ctx context.Context, k breaker.Key, now int64) (breaker.Status, error) {
	e, err := s.get(k)
	if err != nil {
		return breaker.Status{}, err
	}
	var st breaker.Status
	if s.remote(e) {
		if r, err := s.run(ctx, e, "adv", now, nil); err == nil {
			st = statusOf(e, r, now)
		}
	}
	if st.State == "" {
		if st, err = s.local.Status(ctx, e.lk(), now); err != nil {
			return st, err
		}
	}
	if rs := s.egressStatus(ctx, e, now); rs != nil {
		st.ReplicaScope, st.Notable = rs, true
	}
	return st, nil
}

// Sweep implements breaker.Store: due transitions of the breakers this
// replica sees as not closed (on the local view while Redis is
// unreachable).
func (s *Store) Sweep(ctx context.Context, now int64) error {
	if s.eg.notClosed.Load() != 0 {
		_ = s.eg.mem.Sweep(ctx, now)
	}
	if s.sync.localIsTheStore() {
		return s.local.Sweep(ctx, now)
	}
	var errs []error
	for _, e := range s.tab.Load().list {
		v := s.local.Peek(ctx, e.lk(), now)
		if (v.Allowed && v.State == breaker.Closed) || e.bad.Load() {
			continue
		}
		if _, err := s.run(ctx, e, "adv", now, nil); err != nil {
			errs = append(errs, err)
			if !keyError(err) {
				break // degraded now: the rest waits for the resync
			}
		}
	}
	return errors.Join(errs...)
}

var _ breaker.Store = (*Store)(nil)
