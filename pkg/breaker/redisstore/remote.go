package redisstore

import (
	"context"
	"fmt"
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
	r, err := s.call(ctx, e, op, now, a)
	return s.settle(e, op, now, r, err, ans)
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
	vals, err := script.Run(ctx, s.rdb, []string{e.key}, s.scriptArgs(e, op, now, a)...).Slice()
	if err != nil {
		return nil, fmt.Errorf("redisstore %s %s: %w", op, e.id.Route, err)
	}
	return parseReply(vals)
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
	return []any{e.policyArg, string(msgpackMap(append(call, a...)))}
}
