package redisstore

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	replicav1 "github.com/fusebox-llm/fusebox/proto/replica/v1"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
)

// recJob is one queued script call of Record (or of the release an off
// breaker still owes).
type recJob struct {
	e    *entry
	op   string
	now  int64
	adm  breaker.Admission
	res  breaker.Result
	args args
	// local: the outcome is already on the local view (own evidence
	// first), so a failed call must not record it there again.
	local bool
	// tok is the outcome's token among the breaker's pending ones
	// (inflight.go); 0 for a record that was never pending.
	tok uint64
	out breaker.Outcome // the outcome as the policy judged it
}

// recordWorkers run queued records; a breaker always goes to the same one,
// so its outcomes reach Redis in the order they were recorded.
const recordWorkers = 4

// Start runs the replica machinery until ctx ends: the record workers, the
// transition feed (subscriber and publisher) and the periodic refresh, which
// loads the first snapshot (the store is not ready before it), resyncs
// after a reconnect, and writes local opens back after an outage. It
// returns at once; Wait-free: the goroutines end with ctx.
func (s *Store) Start(ctx context.Context) *sync.WaitGroup {
	var wg, recs sync.WaitGroup
	for i := range s.rec {
		wg.Add(1)
		recs.Add(1)
		go func() { defer wg.Done(); defer recs.Done(); s.recordLoop(ctx, i) }()
	}
	s.started.Store(true)
	wg.Add(4)
	go func() { defer wg.Done(); s.hintLoop(ctx) }()
	go func() { defer wg.Done(); s.publishLoop(ctx, &recs) }()
	go func() { defer wg.Done(); s.subscribeLoop(ctx) }()
	go func() { defer wg.Done(); s.refreshLoop(ctx) }()
	return &wg
}

// Ready reports whether the first snapshot has loaded (or Redis was found
// unreachable, and the replica decides on its own: R-ST4).
func (s *Store) Ready() bool { return s.ready.Load() }

// Degraded reports whether Redis is unreachable and the local view is the
// store.
func (s *Store) Degraded() bool { return s.degraded.Load() }

// Origin is this replica's id on the feed.
func (s *Store) Origin() string { return s.origin }

func (s *Store) enqueue(ctx context.Context, e *entry, j recJob) {
	j.e = e
	h := fnv.New32a()
	_, _ = h.Write([]byte(e.key))
	i := h.Sum32() % uint32(len(s.rec))
	o := &s.over[i]
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.jobs) == 0 {
		select {
		case s.rec[i] <- j:
			return
		default:
		}
	}
	// The queue is full (Redis far slower than the traffic): the job waits
	// in the worker's overflow, behind the queue, so that a breaker's
	// outcomes still reach Redis in order; none is dropped before
	// maxOverflow.
	if len(o.jobs) >= maxOverflow {
		s.count("record_queue_full")
		s.jobLocal(ctx, e, j)
		return
	}
	o.jobs = append(o.jobs, j)
}

// overflow is a record worker's jobs past its full queue.
type overflow struct {
	mu   sync.Mutex
	jobs []recJob
}

// maxOverflow bounds one worker's overflow (about 200 MB at worst).
const maxOverflow = 1 << 20

// takeOverflow moves up to maxBatch-len(batch) overflow jobs into batch.
func (s *Store) takeOverflow(i int, batch []recJob) []recJob {
	o := &s.over[i]
	o.mu.Lock()
	defer o.mu.Unlock()
	n := min(maxBatch-len(batch), len(o.jobs))
	batch = append(batch, o.jobs[:n]...)
	o.jobs = append(o.jobs[:0], o.jobs[n:]...)
	return batch
}

// maxBatch bounds the records one worker sends in one round trip.
const maxBatch = 256

// recordLoop runs queued records in batches: whatever is queued when the
// worker comes round (up to maxBatch) goes to Redis in one pipelined round
// trip, so the records a worker writes per second grow with the queue, not
// with 1/RTT. Before, each outcome cost its own round trip and a slow Redis
// (2 ms per direction) lost most of a burst to the full queue.
func (s *Store) recordLoop(ctx context.Context, i int) {
	ch := s.rec[i]
	batch := make([]recJob, 0, maxBatch)
	for {
		batch = s.fill(i, batch[:0])
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				s.drain(i)
				return
			case j := <-ch:
				batch = s.fill(i, append(batch, j))
			}
		}
		s.runBatch(batch)
	}
}

// fill adds to batch what is queued, oldest first: the queue, then the
// overflow behind it.
func (s *Store) fill(i int, batch []recJob) []recJob {
	ch := s.rec[i]
	for len(batch) < maxBatch {
		select {
		case j := <-ch:
			batch = append(batch, j)
			continue
		default:
		}
		break
	}
	if len(batch) < maxBatch {
		batch = s.takeOverflow(i, batch)
	}
	return batch
}

// runBatch runs queued records and releases in one pipeline. Each answer is
// settled as a single call's would be; a job whose call failed (or whose
// breaker is on local state) is recorded on the local view.
func (s *Store) runBatch(batch []recJob) {
	if len(batch) == 1 {
		_, _ = s.runJob(context.Background(), batch[0].e, batch[0])
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, j := range batch {
		if !s.remote(j.e) {
			continue
		}
		cmds[i] = script.EvalSha(ctx, pipe, []string{j.e.key}, s.scriptArgs(j.e, j.op, j.now, j.args)...)
	}
	_, _ = pipe.Exec(ctx)
	for i, j := range batch {
		if cmds[i] == nil {
			s.jobLocal(ctx, j.e, j)
			continue
		}
		vals, err := cmds[i].Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// The script is not loaded (Redis restarted): this job loads
			// it on its own; the next batch finds it.
			_, _ = s.runJob(context.Background(), j.e, j)
			continue
		}
		var r *result
		if err == nil {
			r, err = parseReply(vals)
		} else {
			err = fmt.Errorf("redisstore %s %s: %w", j.op, j.e.id.Route, err)
		}
		j.e.emitMu.Lock()
		j.e.lastNow.Store(j.now)
		_, err = s.settle(j.e, j.op, j.now, r, err, j.answer())
		j.e.emitMu.Unlock()
		if err != nil {
			s.jobLocal(ctx, j.e, j)
		}
	}
}

// drainFor bounds how long the record workers write what is still queued
// when the store stops: inside fusebox's own shutdown, after gRPC drained.
const drainFor = 5 * time.Second

// drain writes the records still queued at shutdown (R-ST8: nothing queued
// is dropped because the process ends), each call bounded by the op
// timeout, all of them by drainFor.
func (s *Store) drain(i int) {
	deadline := time.Now().Add(drainFor)
	for time.Now().Before(deadline) {
		batch := s.fill(i, nil)
		if len(batch) == 0 {
			return
		}
		s.runBatch(batch)
	}
}

func (s *Store) count(op string) {
	if s.opts.OnError != nil {
		s.opts.OnError(op)
	}
}

// failed counts a failed Redis operation and turns the store degraded:
// decisions and recording continue on the local view, logged once until
// Redis is back (R-ST4).
func (s *Store) failed(op string, err error) {
	s.count(op)
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		// go-redis reloads a Cluster's slot map on MOVED, or every 60 s;
		// a connection error to a master that failed (its replica now
		// promoted) reloads nothing, so every call of its slots, and the
		// feed's resubscription, would go on dialling the dead master for
		// up to a minute. The reload is asynchronous and coalesced.
		cc.ReloadState(context.Background())
	}
	if !s.degraded.Swap(true) {
		s.log.Error("[store] Redis is unreachable: deciding and recording on this replica's local state until it returns",
			"op", op, "error", err.Error())
		s.health()
	}
}

// health reports the store's readiness when it changed.
func (s *Store) health() {
	if s.opts.OnHealth == nil {
		return
	}
	// Serialised, and the flags read inside: the last report is always
	// the current state.
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	code := int32(1)
	if s.ready.Load() {
		code |= 2
	}
	if s.degraded.Load() {
		code |= 4
	}
	if s.lastHealth.Swap(code) == code {
		return
	}
	switch {
	case s.degraded.Load():
		s.opts.OnHealth(s.ready.Load(), true, "redis unreachable: deciding on local state")
	case s.ready.Load():
		s.opts.OnHealth(true, false, "redis")
	default:
		s.opts.OnHealth(false, false, "redis: loading the first snapshot")
	}
}

// publish queues the breaker's new decision state for the other replicas.
func (s *Store) publish(e *entry, r *result, now int64) {
	t := &replicav1.Transition{Breaker: e.pbID, Snapshot: pbSnapshot(r), AtMs: now / ms}
	if n := len(r.Events); n > 0 {
		last := r.Events[n-1]
		t.From, t.To, t.Reason = replicav1.State(last.From), replicav1.State(last.To), last.Reason
	}
	env := &replicav1.Envelope{SchemaVersion: replicav1.SchemaVersion_SCHEMA_VERSION_1, Origin: s.origin,
		Body: &replicav1.Envelope_Transition{Transition: t}}
	select {
	case s.pub <- env:
	default:
		s.count("publish") // the refresh brings the others up to date
	}
}

func pbSnapshot(r *result) *replicav1.Snapshot {
	return &replicav1.Snapshot{
		Seq: r.Seq, State: replicav1.State(r.State), Generation: r.Gen, Reason: r.Reason, OpenedAtMs: r.OpenedAt, ReopenedAtMs: r.ReopenedAt,
		Reopens: uint32(r.Reopens), OpenUntilMs: r.OpenUntil, Forced: r.Forced == 1, ForcedUntilMs: r.ForcedUntil, BlockedUntilMs: r.BlockedUntil,
		ProbesInFlight: uint32(r.Leases), ProbesUntilMs: r.Earliest,
	}
}

// PublishOverlay tells the other replicas that gateway's admin overlay
// changed in Redis.
func (s *Store) PublishOverlay(ctx context.Context, gateway string) error {
	env := &replicav1.Envelope{SchemaVersion: replicav1.SchemaVersion_SCHEMA_VERSION_1, Origin: s.origin,
		Body: &replicav1.Envelope_Overlay{Overlay: &replicav1.OverlayChange{Gateway: gateway}}}
	b, err := proto.Marshal(env)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.rdb.Publish(ctx, s.feed, s.sign.sealFeed(s.feed, b)).Err()
}

func (s *Store) publishLoop(ctx context.Context, recs *sync.WaitGroup) {
	for {
		select {
		case <-ctx.Done():
			// The record workers drain what is queued at shutdown (drain);
			// the transitions those records make are published too, within
			// the drain's bound. Before, this loop ended first and they
			// never reached the other replicas.
			recs.Wait()
			s.flushPublished(drainFor)
			return
		case <-s.changed:
			s.flushChanges(ctx)
		case env := <-s.pub:
			s.publishOne(ctx, env)
		}
	}
}

// publishOne sends one transition on the feed, the change note first: a
// replica that reads the feed's hint and one that reads the log find the
// same change.
func (s *Store) publishOne(ctx context.Context, env *replicav1.Envelope) {
	s.flushChanges(ctx)
	b, err := proto.Marshal(env)
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Publish(pctx, s.feed, s.sign.sealFeed(s.feed, b)).Err(); err != nil && ctx.Err() == nil {
		s.count("publish")
	}
}

// flushPublished publishes what is queued when the store stops, for at
// most d.
func (s *Store) flushPublished(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		select {
		case env := <-s.pub:
			s.publishOne(ctx, env)
		default:
			s.flushChanges(ctx)
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// subscribeLoop reads the feed. go-redis reconnects and resubscribes after
// a dropped connection; every subscription after the first asks for a full
// resync, since messages published meanwhile are lost.
func (s *Store) subscribeLoop(ctx context.Context) {
	ps := s.rdb.Subscribe(ctx, s.feed)
	// Receive does not return when ctx ends; closing the subscription
	// does.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		}
		_ = ps.Close()
	}()
	subscribed := false
	backoff := 50 * time.Millisecond
	for {
		msg, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.count("feed")
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				if subscribed {
					s.resync.Store(true)
					s.wake()
				}
				subscribed = true
			}
		case *redis.Message:
			s.onFeed([]byte(m.Payload))
		}
	}
}

// onFeed takes one feed message from another replica. A transition is a
// hint, never a state: the breaker it names is read from Redis (hintLoop),
// so no message, forged or stale, can move a view past what Redis holds
// (R-L12). Before, one forged message with sequence 2^63 pinned a route
// open on every replica, and the refresh could never repair it.
func (s *Store) onFeed(msg []byte) {
	b, err := s.sign.openFeed(s.feed, msg)
	if err != nil {
		s.refused("feed_unsigned", "[store] a feed message without a valid signature was dropped (store.redis.hmac_key_file is set): something other than a fusebox replica of this fleet writes to its Redis")
		return
	}
	var env replicav1.Envelope
	if err := proto.Unmarshal(b, &env); err != nil || env.SchemaVersion != replicav1.SchemaVersion_SCHEMA_VERSION_1 {
		s.count("feed_decode")
		return
	}
	if env.Origin == s.origin {
		return
	}
	switch body := env.Body.(type) {
	case *replicav1.Envelope_Transition:
		t := body.Transition
		if t.Breaker == nil || t.Snapshot == nil {
			s.count("feed_decode")
			return
		}
		id := breaker.ID{Gateway: t.Breaker.Gateway, Route: t.Breaker.Route, Scope: breaker.ScopeGateway}
		if t.Breaker.Scope == replicav1.Scope_SCOPE_GLOBAL {
			id.Scope = breaker.ScopeGlobal
		}
		if e, ok := s.tab.Load().byID[id]; ok && s.remote(e) && !e.hinted.Swap(true) {
			s.hintMu.Lock()
			s.hinted = append(s.hinted, e)
			s.hintMu.Unlock()
			select {
			case s.hint <- struct{}{}:
			default:
			}
		}
	case *replicav1.Envelope_Overlay:
		if s.opts.OnOverlay != nil && body.Overlay != nil {
			s.opts.OnOverlay(body.Overlay.Gateway)
		}
	}
}

// hintLoop reads from Redis each breaker the feed said changed (one
// pipelined round trip for what was named since the last round), its
// state and sequence Redis's own.
func (s *Store) hintLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.hint:
		}
		// Only the breakers named since the last round: the cost follows
		// the transitions, not the number of breakers.
		s.hintMu.Lock()
		batch := s.hinted
		s.hinted = nil
		s.hintMu.Unlock()
		now := s.opts.Clock.Now().UnixNano()
		for _, e := range batch {
			e.hinted.Store(false)
		}
		_ = s.snapAll(ctx, batch, now)
	}
}

// refused drops a message or document for its signature: counted, and
// logged at most once a minute (a writer could send thousands).
func (s *Store) refused(what, msg string) {
	if s.opts.OnRefused != nil {
		s.opts.OnRefused(what)
	}
	now := time.Now().Unix()
	if last := s.unsignedLogged.Load(); now-last >= 60 && s.unsignedLogged.CompareAndSwap(last, now) {
		s.log.Error(msg, "what", what)
	}
}

func (s *Store) refreshLoop(ctx context.Context) {
	t := time.NewTicker(s.opts.RefreshInterval)
	defer t.Stop()
	for {
		s.Refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

func (s *Store) markReady() {
	s.ready.Store(true)
	s.health()
}

func (s *Store) reachable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.rdb.Ping(ctx).Err() == nil
}

// settleLocal writes back what e's local view learned while Redis did not
// answer for it: an operator's override first (it wins over Redis's natural
// state), then a local open, when there was no override or the open came
// after it (its own evidence after the operator's word).
func (s *Store) settleLocal(ctx context.Context, e *entry, now int64) error {
	snap, err := breaker.SnapshotOf(s.local, e.lk, now)
	if err != nil {
		return nil
	}
	po := e.pendingOverride.Load()
	replayed, err := s.replayOverride(ctx, e, now)
	if err != nil {
		return err
	}
	if replayed && !(snap.State == breaker.Open && !snap.Forced && snap.OpenedAt > po.at) {
		return nil
	}
	return s.writeBackSnap(ctx, e, now, snap)
}

// writeBack writes an open (or forced open) the local view learned while
// Redis was unreachable; the script keeps the later of two opens.
func (s *Store) writeBackSnap(ctx context.Context, e *entry, now int64, snap breaker.Snapshot) error {
	if snap.State != breaker.Open && snap.BlockedUntil <= now {
		return nil
	}
	live := snap.State == breaker.Open
	fu := int64(0)
	if snap.Forced {
		fu = snap.ForcedUntil / ms
	}
	ou := snap.OpenUntil / ms
	if !live {
		ou = 0
	}
	// The result must not reach the local view, which is still the store
	// until the resync ends (answerResync); the transitions the merge makes
	// in Redis (the open written back, a due one on the way) are reported
	// and published as any script's. Before, they were dropped: the shared
	// chain of transitions had a gap (half_open, then open->half_open).
	// The call is made without emitMu: a decision's probe call on this
	// breaker must not wait behind a write-back (the lock orders reports,
	// not calls).
	r, err := s.call(ctx, e, "merge", now, args{
		{"forced", snap.Forced && live}, {"forced_until", fu}, {"opened_at", snap.OpenedAt / ms},
		{"open_until", ou}, {"reopens", snap.Reopens}, {"reason", snap.Reason}, {"blocked_until", snap.BlockedUntil / ms},
	})
	if err != nil {
		s.count("merge")
		return err
	}
	e.emitMu.Lock()
	defer e.emitMu.Unlock()
	_, err = s.settle(e, "merge", now, r, nil, answer{kind: answerResync})
	return err
}
