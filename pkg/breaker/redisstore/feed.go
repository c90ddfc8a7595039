package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	replicav1 "github.com/fusebox-llm/fusebox/proto/replica/v1"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
)

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
		ProbesInFlight: uint32(r.Leases), ProbesUntilMs: r.Earliest, SaturatedUntilMs: r.SaturatedUntil,
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
		s.onTransition(body.Transition)
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

// onTransition: another replica changed a breaker; the hint loop reads it
// from Redis (the message is a hint, never the state itself).
func (s *Store) onTransition(t *replicav1.Transition) {
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
}
