package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Refresh brings the local view up to date with Redis. Usually that is one
// read of the change log and one pipelined read of the breakers it names
// (with nothing changing, one call per period whatever the number of
// breakers); every breaker is read after an outage (first writing back the
// opens learned locally), after a feed reconnect, when the log's notes in
// between are unknown, and every FullRefreshInterval. The first success
// makes the store ready; a first attempt that finds Redis unreachable makes
// it ready and degraded (a replica decides on its own rather than not at
// all).
func (s *Store) Refresh(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	defer s.markReady()
	now := s.opts.Clock.Now().UnixNano()
	// The resync is the phases of syncstate.go: degraded, then (Redis
	// answering) writingBack, then reading, then synced. A refresh that
	// starts past synced walks the rest of the way; a failed call anywhere
	// sends the store back to degraded.
	ph := s.sync.phase()
	resyncing := ph != synced
	if ph == degraded || ph == writingBack {
		if !s.reachable(ctx) {
			return
		}
		s.sync.step(reachable)
		if !s.writeBackAll(ctx, now) {
			return
		}
	}
	plan, ok := s.planRefresh(ctx, now, resyncing)
	if !ok {
		return
	}
	s.writeBackBroken(ctx, plan.read, now)
	if err := s.snapAll(ctx, plan.read, now); err != nil {
		return
	}
	if plan.commit != nil {
		plan.commit()
	}
	if plan.full {
		s.lastFull.Store(now)
	}
	if _, moved := s.sync.step(readBack); moved {
		s.health()
	}
	if (resyncing || plan.resync) && s.opts.OnOverlay != nil {
		// Overlay changes published meanwhile were missed too.
		s.opts.OnOverlay("")
	}
}

// refreshPlan is what one refresh reads.
type refreshPlan struct {
	read   []*entry // the breakers to read
	full   bool     // every breaker
	resync bool     // the feed asked for a full resync
	commit func()   // moves the change log's cursor once the reads landed
}

// writeBackAll is the resync's first step after an outage: what every
// breaker's view learned meanwhile goes back, its outcomes (R-ST14) first,
// then its opens and overrides. It reports false when Redis failed again.
func (s *Store) writeBackAll(ctx context.Context, now int64) bool {
	for _, e := range s.tab.Load().list {
		if err := s.sendUnsent(ctx, e, now); err != nil && !keyError(err) {
			return false
		}
		if err := s.settleLocal(ctx, e, now); err != nil && !keyError(err) {
			return false
		}
	}
	return true
}

// planRefresh reads the change log and decides which breakers to read:
// those it names, those never read or on local state, or all of them
// (after an outage, a feed reconnect, an unreadable log, or every
// FullRefreshInterval). After an outage or a resync the views' sequences
// start again (Redis may have restarted empty), and the scripts are the
// store again. It reports false when Redis failed.
func (s *Store) planRefresh(ctx context.Context, now int64, wasDegraded bool) (refreshPlan, bool) {
	// The log is read before the breakers: a change noted after this read
	// is read at the next refresh.
	keys, all, commit, err := s.changedSince(ctx)
	if err != nil {
		if !keyError(err) {
			s.failed("refresh", err)
			return refreshPlan{}, false
		}
		all = true // the log itself is unreadable: read everything
	}
	plan := refreshPlan{commit: commit, resync: s.resync.Swap(false)}
	plan.full = wasDegraded || plan.resync || all || now-s.lastFull.Load() >= int64(s.opts.FullRefreshInterval)
	tab := s.tab.Load()
	if wasDegraded || plan.resync {
		for _, e := range tab.list {
			e.viewMu.Lock()
			e.seq = 0
			e.viewMu.Unlock()
		}
	}
	if wasDegraded {
		// From here the scripts are the store again (their results apply to
		// the view); a failure below turns it degraded once more. A call
		// that failed since the write-back left the store degraded, and
		// this changes nothing.
		s.lines.Lock()
		if _, moved := s.sync.step(writtenBack); moved {
			// Logged here, where this replica's local decisions end, not
			// after the read back: the soak reads a replica's local chain
			// up to this line, and a transition the scripts made between
			// the two (decided_by=redis) fell into it ("half_open->open
			// after closed" in the fleet soak).
			s.log.Info("[store] Redis is reachable again: local outcomes and opens written back; the state is read back next", "breakers", len(tab.list))
		}
		s.lines.Unlock()
	}
	plan.read = tab.list
	if !plan.full {
		plan.read = tab.changed(keys)
	}
	return plan, true
}

// changed is the breakers the change log names, and those to read
// whatever it says (unsettled).
func (tab *table) changed(keys []string) []*entry {
	var read []*entry
	seen := make(map[*entry]bool, len(keys))
	for _, k := range keys {
		if e, ok := tab.byKey[k]; ok && !seen[e] {
			seen[e] = true
			read = append(read, e)
		}
	}
	for _, e := range tab.list {
		if !seen[e] && e.unsettled() {
			read = append(read, e)
		}
	}
	return read
}

// unsettled reports whether e must be read whatever the log says: never
// read yet (installed since), on local state alone, with an override or
// outcomes Redis has not taken, or behind Redis.
func (e *entry) unsettled() bool {
	return e.last.Load() == nil || e.bad.Load() || e.behind.Load() || e.hasUnsent()
}

// writeBackBroken heals the breakers about to be read that need it first:
// one Redis answered with an older state (healBehind), or one on the local
// view alone since Redis refused it or an override failed (what it learned
// goes back, as after an outage).
func (s *Store) writeBackBroken(ctx context.Context, read []*entry, now int64) {
	for _, e := range read {
		if e.behind.Swap(false) {
			s.healBehind(ctx, e, now)
			continue
		}
		if e.bad.Load() || e.hasUnsent() {
			if s.sendUnsent(ctx, e, now) == nil {
				_ = s.settleLocal(ctx, e, now)
			}
		}
	}
}

// snapAll reads the breakers' states from Redis into the local view, up to
// maxBatch per pipelined round trip; each answer is settled as a single
// call's would be. It returns the error that turned the store degraded (a
// key's own error degrades only its breaker and is not returned).
func (s *Store) snapAll(ctx context.Context, list []*entry, now int64) error {
	for len(list) > 0 {
		n := min(len(list), maxBatch)
		batch := list[:n]
		list = list[n:]
		if err := s.snapBatch(ctx, batch, now); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) snapBatch(ctx context.Context, batch []*entry, now int64) error {
	if len(batch) == 1 {
		if !s.remote(batch[0]) {
			return s.degradedErr()
		}
		return s.snapOne(ctx, batch[0], now)
	}
	pctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	ids := make([]uint64, len(batch))
	for i, e := range batch {
		if s.remote(e) {
			var a args
			a, ids[i] = named("snap", nil)
			cmds[i] = script.EvalSha(pctx, pipe, []string{e.key}, s.scriptArgs(e, "snap", now, a)...)
		}
	}
	_, _ = pipe.Exec(pctx)
	for i, e := range batch {
		if cmds[i] == nil {
			continue
		}
		if err := s.snapAnswered(ctx, e, now, cmds[i], ids[i]); err != nil {
			return err
		}
	}
	return nil
}

// snapOne refreshes one breaker with its own script call; a key's own
// error is that breaker's, not the refresh's.
func (s *Store) snapOne(ctx context.Context, e *entry, now int64) error {
	if _, err := s.run(ctx, e, "snap", now, nil); err != nil && !keyError(err) {
		return err
	}
	return nil
}

// snapAnswered takes one pipelined snap's answer for e.
func (s *Store) snapAnswered(ctx context.Context, e *entry, now int64, cmd *redis.Cmd, id uint64) error {
	vals, err := cmd.Slice()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Redis restarted and lost the script: this call loads it.
		return s.snapOne(ctx, e, now)
	}
	var r *result
	if err == nil {
		r, err = parseReply(vals)
	} else {
		err = fmt.Errorf("redisstore snap %s: %w", e.id.Route, err)
		if !keyError(err) {
			s.oweLost(e, id, now)
		}
	}
	e.emitMu.Lock()
	e.lastNow.Store(now)
	_, err = s.settle(e, "snap", now, r, err, answer{kind: answerRead})
	e.emitMu.Unlock()
	if err != nil && !keyError(err) {
		return err
	}
	return nil
}

// degradedErr is what a refresh reports when the store turned degraded
// under it.
func (s *Store) degradedErr() error {
	if s.sync.localIsTheStore() {
		return errDegraded
	}
	return nil
}

var errDegraded = fmt.Errorf("redisstore: Redis is unreachable")

// healBehind puts back what Redis lost when it answered e with a state
// older than the view's (R-ST8): a failover to a replica that lacked the
// last writes, or a restored snapshot. The view's open (or block) is
// written back (the script keeps the later of two opens, so after a mere
// late answer it changes nothing), and the view then takes Redis's state
// whatever its sequence: Redis's counter restarted below the view's, and
// until it passed it again the view would ignore every later change.
// What is not put back: the window counts of the lost outcomes (the
// breaker needs that many failures again to trip) and a close Redis lost
// (the route stays open until its cooldown, then probes as usual).
func (s *Store) healBehind(ctx context.Context, e *entry, now int64) {
	if s.remote(e) {
		if err := s.settleLocal(ctx, e, now); err != nil {
			e.behind.Store(true) // the next refresh tries again
			return
		}
	}
	e.viewMu.Lock()
	e.seq = 0
	e.viewMu.Unlock()
}
