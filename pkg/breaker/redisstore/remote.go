package redisstore

import (
	"context"
	"fmt"
	"strings"
)

// run calls the script for e, puts the result into the local view and
// reports this replica's transitions in order. A failed call turns the
// store degraded (R-ST4).
func (s *Store) run(ctx context.Context, e *entry, op string, now int64, a args) (*result, error) {
	return s.runAs(ctx, e, op, now, answer{kind: answerRead}, a)
}

// runAs is run for a call whose answer the view takes as a says.
func (s *Store) runAs(ctx context.Context, e *entry, op string, now int64, ans answer, a args) (*result, error) {
	e.emitMu.Lock()
	defer e.emitMu.Unlock()
	e.lastNow.Store(now)
	a, id := named(op, a)
	r, err := s.call(ctx, e, op, now, a)
	if err != nil && id != 0 && !keyError(err) {
		s.oweLost(e, id, now)
	}
	return s.settle(e, op, now, r, err, ans)
}

// named gives a call that may make a transition, other than a record
// (which carries its outcome's id), an id of its own: a call whose answer
// is lost (the op timeout passed after Redis ran it) may have made a
// transition nobody reported, which the script keeps by that id for the
// caller to ask for (oweLost). 0: a call that needs none.
func named(op string, a args) (args, uint64) {
	switch op {
	case "acq", "adv", "snap", "stl", "merge":
		id := newLeaseID()
		return append(a, arg{"call", id}), id
	}
	return a, 0
}

// oweLost asks, when Redis answers again and before the resync, for the
// transitions a call whose answer was lost made (op lost): they are
// reported then, once. Before, a timed-out acq that turned a route
// half-open left that transition unreported on every replica.
func (s *Store) oweLost(e *entry, id uint64, now int64) {
	s.owe(e, recJob{e: e, op: "lost", now: now, args: args{{"call", id}}})
}

// settle takes one script call's answer for e (with e.emitMu held): an
// error turns the breaker (a key's own error) or the store degraded; a
// result goes into the local view, its transitions are reported in order
// and published. The one place a script's answer is taken.
func (s *Store) settle(e *entry, op string, now int64, r *result, err error, a answer) (*result, error) {
	if err != nil {
		if keyError(err) {
			s.keyFailed(e, op, err)
		} else {
			s.failed(op, err)
		}
		return nil, err
	}
	s.keyAnswered(e, r)
	e.last.Store(r)
	s.apply(e, r.Incarnation, r.Seq, r.snapshot(), a)
	if s.opts.OnEvent != nil {
		for _, ev := range r.Events {
			s.opts.OnEvent(s.event(e, ev, now))
		}
	}
	if r.Changed && s.started.Load() {
		s.noteChange(e)
		s.publish(e, r, now)
	}
	return r, nil
}

// call runs the script once for e, within the op timeout, and parses its
// reply; it changes nothing on this side.
func (s *Store) call(ctx context.Context, e *entry, op string, now int64, a args) (*result, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	vals, err := script.Run(ctx, s.rdb, scriptKeys(e, a), s.scriptArgs(e, op, now, a)...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redisstore %s %s: %w", op, e.id.Route, err)
	}
	return parseReply(vals)
}

// scriptKeys are the keys a call on e touches: the breaker's state and,
// for a keyed record (R-DL11), the record's key under the same hash tag
// (one Cluster slot), which the script checks and sets itself.
func scriptKeys(e *entry, a args) []string {
	if k, ok := a.get("rkey").(string); ok && k != "" {
		return []string{e.key, strings.TrimSuffix(e.key, "state") + "rec:" + k}
	}
	return []string{e.key}
}

// scriptArgs are the script's two arguments for op on e (breaker.lua):
// the packed policy, and the call: op, its time, then the operation's own
// named arguments. The time is the event's age, which the script takes
// from Redis's TIME (R-ST16); with Options.TestClock it is the caller's
// clock itself.
func (s *Store) scriptArgs(e *entry, op string, now int64, a args) []any {
	call := make(args, 0, 2+len(a))
	call = append(call, arg{"op", op})
	if s.opts.TestClock {
		call = append(call, arg{"now", now / ms})
	} else {
		call = append(call, arg{"age", max(0, s.opts.Clock.Now().UnixNano()-now) / ms})
	}
	return []any{e.conf.Load().policyArg, string(msgpackMap(append(call, a...)))}
}
