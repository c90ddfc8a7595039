package redisstore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// This replica's own view of its egress (R-FD2, R-FD3). A failure Envoy
// originated (no answer came: refused, reset, timed out before headers)
// may be this pod's egress rather than the provider: Redis counts it for
// the fleet only once enough replicas saw such failures (breaker.lua's
// quorum), and meanwhile it trips this replica alone. The egress view is
// a second memory store, fed this replica's local failures and its
// successes, with each breaker's own policy: its open is the route's
// `open` with scope `replica`, with the same cooldown, probes and backoff,
// and no other replica is told of it. It acts only where the quorum
// holds failures back (a policy with local_origin_quorum above 1, more
// than one replica alive, Redis answering): otherwise Redis counts the
// failure for everyone at once, as before, and the egress view stays
// closed.

// egressLease marks a probe slot of the egress view in an admission's
// lease (with localLease and the replica's tag: no other replica frees
// it); local lease numbers never reach it.
const egressLease = uint64(1) << (tagShift - 1)

type egressView struct {
	mem *breaker.Memory
	// notClosed counts the egress breakers not closed: while 0, a decision
	// pays one atomic load for the egress view.
	notClosed atomic.Int64
	mu        sync.Mutex
	open      map[breaker.ID]bool
	// gens keeps the generation an egress probe was admitted in, by its
	// lease (the admission carries the shared state's).
	gens sync.Map // uint64 → uint64
}

// newEgress makes the egress view; its transitions are reported with the
// replica's id and scope replica, never published to the fleet.
func (s *Store) newEgress() *egressView {
	eg := &egressView{open: map[breaker.ID]bool{}}
	eg.mem = breaker.NewMemory(func(ev breaker.Event) {
		if ev.Saturation != "" {
			return
		}
		eg.mu.Lock()
		was := eg.open[ev.ID]
		now := ev.To != breaker.Closed
		if was != now {
			if now {
				eg.open[ev.ID] = true
				eg.notClosed.Add(1)
			} else {
				delete(eg.open, ev.ID)
				eg.notClosed.Add(-1)
			}
		}
		eg.mu.Unlock()
		if s.opts.OnEvent != nil {
			ev.DecidedBy = breaker.DecidedByLocal
			ev.ReplicaScoped = true
			ev.Replica = s.origin
			s.opts.OnEvent(ev)
		}
	})
	return eg
}

// egressActs reports whether e's locally originated failures are held for
// a quorum, so that they trip this replica's egress view.
func (s *Store) egressActs(e *entry) bool {
	return s.quorumPolicy(e) && s.remote(e)
}

// quorumPolicy: e's policy holds local failures for a quorum of the
// replicas last counted alive. While Redis is away the egress view still
// takes them: the failures it held before the blip and the ones during it
// are one replica's evidence, and add up to its threshold. (The degraded
// store's fallback view counts them too, and Redis holds them for the
// quorum when they are written back.) Before, a blip started the count
// again on the fallback view: a pod with a broken egress sent threshold +
// held attempts to it.
func (s *Store) quorumPolicy(e *entry) bool {
	return e.policy().Active() && e.policy().LocalOriginQuorum > 1 && s.alive.Load() > 1
}

// Peek implements breaker.Store: the shared state's verdict (the local
// view of Redis), unless this replica's egress view refuses the route.
func (s *Store) Peek(ctx context.Context, k breaker.Key, now int64) breaker.Verdict {
	v := s.local.Peek(ctx, k, now)
	if !v.Allowed || s.eg.notClosed.Load() == 0 {
		return v
	}
	e, err := s.get(k)
	if err != nil {
		return v
	}
	if ev := s.eg.mem.Peek(ctx, e.egk(), now); !ev.Allowed || ev.ProbesFull {
		ev.ReplicaScoped = true
		ev.Saturated, ev.SaturatedUntil = v.Saturated, v.SaturatedUntil
		return ev
	}
	return v
}

// acquireEgress admits through the egress view too, when it is not
// closed: refused while it is open (unless forced), and a half-open
// egress takes a probe slot of its own, carried in the lease when the
// shared state took none.
func (s *Store) acquireEgress(ctx context.Context, k breaker.Key, now int64, force bool) (breaker.Admission, bool, error) {
	e, err := s.get(k)
	if err != nil {
		return s.acquireShared(ctx, k, now, force)
	}
	if _, healthy := breaker.AcquireHealthy(s.eg.mem, e.egk()); healthy {
		return s.acquireShared(ctx, k, now, force)
	}
	eadm, ok, _ := s.eg.mem.Acquire(ctx, e.egk(), now, force)
	if !ok {
		return breaker.Admission{}, false, nil
	}
	adm, ok, err := s.acquireShared(ctx, k, now, force)
	if eadm.Lease == 0 {
		return adm, ok, err
	}
	if !ok || adm.Lease != 0 || eadm.Lease >= egressLease {
		_ = s.eg.mem.Release(ctx, e.egk(), eadm)
		return adm, ok, err
	}
	lease := eadm.Lease | egressLease | localLease | s.leaseTag
	s.eg.gens.Store(lease, eadm.Gen)
	adm.Lease = lease
	return adm, ok, err
}

// egressAdmission takes the egress view's probe slot out of adm, if it
// holds one of this replica's: the egress view's admission, and what is
// left for the shared state.
func (s *Store) egressAdmission(adm breaker.Admission) (eadm breaker.Admission, rest breaker.Admission, ok bool) {
	if adm.Lease&localLease == 0 || adm.Lease&egressLease == 0 || adm.Lease&tagMask != s.leaseTag {
		return breaker.Admission{}, adm, false
	}
	g, found := s.eg.gens.LoadAndDelete(adm.Lease)
	rest = adm
	rest.Lease = 0
	if !found {
		return breaker.Admission{}, rest, true // released already
	}
	return breaker.Admission{Gen: g.(uint64), Lease: adm.Lease &^ (egressLease | localLease | tagMask)}, rest, true
}

// recordEgress puts an outcome on the egress view: a locally originated
// failure while the quorum holds such failures back, a success (its rate
// window, and a probe's close), and an egress probe's end whatever it
// was. Anything else only frees the probe's slot.
func (s *Store) recordEgress(ctx context.Context, e *entry, now int64, eadm breaker.Admission, probe bool, r breaker.Result, o breaker.Outcome) {
	localFail := o.Class == breaker.Failure && o.Origin() == breaker.OriginLocal
	switch {
	case localFail && s.quorumPolicy(e), o.Class == breaker.Success && (probe || s.eg.notClosed.Load() != 0 || s.quorumPolicy(e)):
		if !probe {
			eadm = breaker.Admission{Gen: breaker.CurrentGen(s.eg.mem, e.egk())}
		}
		_, _ = s.eg.mem.Record(ctx, e.egk(), now, eadm, r)
	case probe:
		_ = s.eg.mem.Release(ctx, e.egk(), eadm)
	}
}

// egressStatus is this replica's own open of e's route, nil when none.
func (s *Store) egressStatus(ctx context.Context, e *entry, now int64) *breaker.ReplicaScope {
	if s.eg.notClosed.Load() == 0 {
		return nil
	}
	st, err := s.eg.mem.Status(ctx, e.egk(), now)
	if err != nil {
		return nil
	}
	return breaker.ReplicaScopeOf(s.origin, st)
}
