package redisstore

import (
	"context"
	mrand "math/rand/v2"
	"strconv"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// Recording: an outcome is judged by the breaker's policy here, put on the
// local view at once (own evidence first, R-ST6), and queued for Redis;
// what Redis does not take is kept for the resync (inflight.go, R-ST14).

// Record implements breaker.Store: the attempt is judged here with the
// installed policy, and applied by one script call (queued, with
// AsyncRecord). When Redis is unreachable it is recorded on the local view,
// so no outcome is lost.
func (s *Store) Record(ctx context.Context, k breaker.Key, now int64, adm breaker.Admission, r breaker.Result) (breaker.Recorded, error) {
	e, err := s.get(k)
	if err != nil {
		return breaker.Recorded{}, err
	}
	p := e.policy()
	if eadm, rest, probe := s.egressAdmission(adm); probe || s.eg.notClosed.Load() != 0 || s.quorumPolicy(e) {
		adm = rest
		s.recordEgress(ctx, e, now, eadm, probe, r, p.Judge(r))
	}
	// ladm is what the local view frees: a slot it gave (this replica's
	// local lease), nothing else (a Redis lease expires in Redis; another
	// replica's local lease is its own). adm goes to Redis, which never
	// held a local slot.
	ladm := adm
	ladm.Lease = 0
	if adm.Lease&localLease != 0 {
		if n, mine := s.localSlot(adm.Lease); mine {
			ladm.Lease = n
		}
		adm.Lease = 0
	}
	if !s.remote(e) {
		rec, err := s.local.Record(ctx, e.lk(), now, ladm, r)
		if p.Active() && !rec.AlreadyApplied {
			// Redis does not take it now: it is written before the resync
			// reads the breaker back (R-ST14).
			s.notTaken(e, s.recordJob(e, now, adm, r, true))
		}
		return rec, err
	}
	if !p.Active() {
		if ladm.Lease != 0 {
			_ = s.local.Release(ctx, e.lk(), ladm)
		}
		if adm.Lease != 0 {
			s.enqueue(ctx, e, recJob{op: "rel", now: now, args: args{{"lease", adm.Lease}}})
		}
		return breaker.Recorded{}, nil
	}
	job := s.recordJob(e, now, adm, r, false)
	o := job.out
	if s.opts.AsyncRecord && s.rec != nil {
		// Own evidence first (R-ST6): this replica's next decision sees
		// the outcome now, whatever Redis is doing (slow, paused, down);
		// Redis's answer, when it comes, goes under it (R-ST13). Before,
		// the view learned of a tripping failure only from Redis's answer,
		// and with Redis stalled 19 of 20 next decisions still chose the
		// route. A probe the local view admitted while Redis was away and
		// that ends after the resync is counted in Redis too (before, on
		// the local view only).
		var own breaker.Recorded
		ownRes, failure := r, o.Class == breaker.Failure
		if failure && o.Origin() == breaker.OriginLocal && s.egressActs(e) {
			// Held for a quorum (R-FD2): it is this replica's egress
			// view's evidence (recordEgress), not the shared state's,
			// unless Redis counts it.
			ownRes, failure = breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonHeldForQuorum, Key: r.Key, KeyLifeMs: r.KeyLifeMs}, false
		}
		job.tok, own = s.recordOwn(ctx, e, now, ladm, ownRes, failure)
		if own.AlreadyApplied {
			// This replica sent the key already (R-DL11): Redis has it, or
			// will from that first call or its resend. Only a slot this
			// call holds in Redis is given back.
			if adm.Lease != 0 {
				s.enqueue(ctx, e, recJob{op: "rel", now: now, args: args{{"lease", adm.Lease}}})
			}
			return breaker.Recorded{Outcome: o, AlreadyApplied: true}, nil
		}
		job.local = true
		s.enqueue(ctx, e, job)
		return breaker.Recorded{Outcome: o, Applied: true}, nil
	}
	if ladm.Lease != 0 {
		_, _ = s.local.Record(ctx, e.lk(), now, ladm, r)
		job.local = true
	}
	res, err := s.runJob(ctx, e, job)
	if err != nil || res == nil {
		return breaker.Recorded{Outcome: o, Applied: true}, err
	}
	if res.Already {
		return breaker.Recorded{Outcome: o, AlreadyApplied: true}, nil
	}
	return breaker.Recorded{Outcome: o, Stale: res.Stale == 1, Applied: true}, nil
}

// recordJob is the script call that records r on e: the outcome as e's
// policy judges it, and the script's arguments. local: it is on the local
// view already.
func (s *Store) recordJob(e *entry, now int64, adm breaker.Admission, r breaker.Result, local bool) recJob {
	p := e.policy()
	o := p.Judge(r)
	class := 0
	switch o.Class {
	case breaker.Success:
		class = 1
	case breaker.Failure:
		class = 2
	}
	// Deadlines go as durations from the event (R-H8): the script makes
	// them Redis's own time, so a replica whose clock is behind or ahead
	// blocks and saturates the fleet for what the provider said.
	ra := int64(0)
	if r.RetryAfterUnixNano > now {
		ra = max((r.RetryAfterUnixNano-now)/ms, 1)
	}
	j := recJob{e: e, op: "rec", now: now, adm: adm, res: r, out: o, local: local, args: args{
		{"id", newRecordID()}, {"class", class}, {"reason", o.Reason}, {"slow", o.Slow}, {"slow_by", o.SlowBy}, {"open_now", o.OpenNow},
		{"counted", o.Counted}, {"gen", adm.Gen}, {"lease", adm.Lease}, {"retry_after_in", ra},
		{"route_scope", e.id.Scope == breaker.ScopeGateway}, {"status", r.Status},
		{"block_retry_after", p.RetryAfter == breaker.RetryAfterBlock}, {"max_retry_after_sec", p.MaxRetryAfterSec},
	}}
	if o.Class == breaker.Failure && o.Origin() == breaker.OriginLocal {
		// Envoy got no answer: it may be this replica's egress. Redis
		// counts it for the fleet only with a quorum of replicas (R-FD2).
		j.args = append(j.args, arg{"origin_local", true}, arg{"replica", s.origin}, arg{"alive", s.alive.Load()})
	}
	if r.Key != "" {
		// Keyed (R-DL11): Redis applies the key once while it lives, from
		// whichever replica and channel it comes.
		life := r.KeyLifeMs
		if life <= 0 {
			life = breaker.DefaultRecordKeyLife
		}
		j.args = append(j.args, arg{"rkey", r.Key}, arg{"key_life", life})
	}
	if r.SaturateUntil != 0 || r.Unsaturate {
		// The quota's headroom (R-H2): only a response that announced it.
		su := int64(0)
		if r.SaturateUntil > now {
			su = max((r.SaturateUntil-now)/ms, 1)
		}
		age := int64(-1)
		if r.DecidedAt != 0 {
			age = max(now-r.DecidedAt, 0) / ms
		}
		j.args = append(j.args, arg{"saturate_in", su}, arg{"unsaturate", r.Unsaturate}, arg{"decided_age", age})
	}
	return j
}

// runJob runs a queued (or synchronous) record or release; when Redis
// fails it records on the local view instead.
func (s *Store) runJob(ctx context.Context, e *entry, j recJob) (*result, error) {
	if !s.remote(e) {
		s.jobLocal(ctx, e, j)
		return nil, nil
	}
	r, err := s.runAs(ctx, e, j.op, j.now, j.answer(), j.args)
	if err != nil {
		s.jobLocal(ctx, e, j)
	}
	return r, err
}

// answer is how the view takes the job's answer.
func (j recJob) answer() answer {
	if j.op == "rec" {
		return answer{kind: answerRecord, tok: j.tok}
	}
	return answer{kind: answerRead}
}

func (s *Store) jobLocal(ctx context.Context, e *entry, j recJob) {
	if j.op == "rel" {
		s.owe(e, j)
		return
	}
	if j.op != "rec" {
		return
	}
	if !j.local {
		adm := j.adm
		adm.Lease = 0 // a Redis lease: nothing to free locally
		_, _ = s.local.Record(ctx, e.lk(), j.now, adm, j.res)
	}
	// Redis did not take it: it goes back before the resync (R-ST14),
	// with its lease, which Redis then frees (lease ids are random, so an
	// old one never frees a later probe's slot).
	s.notTaken(e, j)
}

// newRecordID names one outcome in Redis: a record whose answer never came
// (a timeout after Redis ran it) is sent again before the resync, and
// Redis applies it once (breaker.lua keeps the ids it applied lately, and
// answers a repeat with the transitions the first call made).
func newRecordID() string {
	return strconv.FormatUint(mrand.Uint64(), 36)
}
