package redisstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// The robustness checker (#49, R-DL11, R-DL12, R-DL14), in the way etcd
// tests itself: three replicas on a real redis-server, each behind
// failpoints in its own Redis client (a call refused before it ran, a reply
// lost after the script ran, a call that runs in Redis after the caller
// gave up) while Redis pauses now and then (CLIENT PAUSE WRITE, as a fork or
// a failover pauses it), run a random schedule of keyed
// records — each request's real outcome delivered by one to three channels
// on random replicas, as the route role, the observer, the access log and a
// resend after an outage would — with unkeyed neithers (expiries, cancels)
// among them. The history is the set of (decision, attempt) keys with a real
// outcome. Once every replica is quiet, Redis must hold exactly one applied
// record per key: the rate window's calls equal the keys, its failures the
// failure keys. No slack: one record lost or counted twice fails the seed.
//
// A short run is part of the suite; -robust.seeds=N runs more (the figure
// in the closing note is from -robust.seeds=200).

var robustSeeds = flag.Int("robust.seeds", 8, "seeds of the Redis robustness checker to run")

// failpoint is what one script call meets.
type failpoint int

const (
	fpNone    failpoint = iota
	fpRefused           // an error before the call left: it never ran
	fpLost              // it ran in Redis; the reply is lost (a timeout)
	fpLate              // it runs in Redis after the caller gave up
	failpoints
)

func (f failpoint) String() string {
	return [...]string{"none", "refused", "lost", "late"}[f]
}

// faults is one replica's failpoints: while on, a breaker script call meets
// a random one of them (two calls in three meet none, so that a replica
// also runs between its outages).
type faults struct {
	on   atomic.Bool
	rnd  *rand.Rand
	mu   sync.Mutex
	raw  redis.UniversalClient // sends a late call, past the hooks
	hits [failpoints]atomic.Int64
	// late counts the late calls still on their way (a counter, not a
	// WaitGroup: a hook may start one while the test waits for the rest).
	late atomic.Int64
}

func (f *faults) pick() failpoint {
	if !f.on.Load() {
		return fpNone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rnd.IntN(3) != 0 {
		return fpNone
	}
	return failpoint(1 + f.rnd.IntN(int(failpoints)-1))
}

func (f *faults) lateDelay() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Duration(20+f.rnd.IntN(150)) * time.Millisecond
}

// breakerCall: a call of the breaker script (its first key is a state).
func breakerCall(cmd redis.Cmder) bool {
	a := cmd.Args()
	if len(a) < 4 {
		return false
	}
	name := strings.ToLower(fmt.Sprint(a[0]))
	if name != "evalsha" && name != "eval" {
		return false
	}
	key, _ := a[3].(string)
	return strings.HasSuffix(key, ":state")
}

func (f *faults) apply(ctx context.Context, cmd redis.Cmder, run func(context.Context) error) error {
	if !breakerCall(cmd) {
		return run(ctx)
	}
	fp := f.pick()
	f.hits[fp].Add(1)
	switch fp {
	case fpRefused:
		err := errors.New("failpoint: refused before it ran")
		cmd.SetErr(err)
		return err
	case fpLost:
		_ = run(ctx)
		cmd.SetErr(context.DeadlineExceeded)
		return context.DeadlineExceeded
	case fpLate:
		args := cmd.Args()
		d := f.lateDelay()
		f.late.Add(1)
		go func() {
			defer f.late.Add(-1)
			time.Sleep(d) // the call is still on its way to Redis
			_ = f.raw.Do(context.Background(), args...).Err()
		}()
		cmd.SetErr(context.DeadlineExceeded)
		return context.DeadlineExceeded
	}
	return run(ctx)
}

func (f *faults) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return f.apply(ctx, cmd, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}
func (f *faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || !breakerCall(cmds[0]) {
			return next(ctx, cmds)
		}
		// One failpoint for the whole round trip.
		return f.apply(ctx, cmds[0], func(ctx context.Context) error { return next(ctx, cmds) })
	}
}

// delivery is one channel delivering one outcome on one replica.
type delivery struct {
	replica int
	res     breaker.Result
}

// flushes is the FLUSHALL schedule's record: when the last one ended,
// and when each key's first delivery started.
type flushes struct {
	mu        sync.Mutex
	n         int
	lastEnd   time.Time
	firstSent map[string]time.Time
}

func (f *flushes) sent(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.firstSent[key]; !ok {
		f.firstSent[key] = time.Now()
	}
}

// recMarkers reads the record keys Redis holds under prefix: the keys of
// the outcomes applied since the last FLUSHALL (the script sets each with
// its count, and a flush takes both).
func recMarkers(t *testing.T, c redis.UniversalClient, prefix string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	iter := c.Scan(context.Background(), 0, prefix+"*:rec:*", 1000).Iterator()
	for iter.Next(context.Background()) {
		k := iter.Val()
		out[k[strings.LastIndex(k, ":rec:")+len(":rec:"):]] = true
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRobustnessKeyedRecords(t *testing.T) {
	srv := redistest.Start(t)
	base := srv.Client(t)
	for seed := uint64(1); seed <= uint64(*robustSeeds); seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			runRobustSeed(t, srv, base, seed)
		})
	}
}

func runRobustSeed(t *testing.T, srv *redistest.Server, base redis.UniversalClient, seed uint64) {
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 0x5eed))
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) {
		p.FailureThreshold, p.WindowSec, p.RateWindowSec = 1<<30, 3600, 3600
	})
	prefix := fmt.Sprintf("robust%d:", seed)
	const n = 3
	fs := make([]*faults, n)
	rs := make([]*replica, n)
	clients := make([]redis.UniversalClient, n)
	for i := range clients {
		client, err := redisstore.NewClient("redis://" + srv.Addr + "/0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		fs[i] = &faults{rnd: rand.New(rand.NewPCG(seed, uint64(i))), raw: base}
		client.AddHook(fs[i])
		clients[i] = client
	}
	for i := range rs {
		rs[i] = replicasWith(t, clients[i], prefix, clk, p, 1, 60*time.Millisecond, func(_ int, o *redisstore.Options) {
			// A quick resync: the replicas go back to Redis soon after each
			// fault, so that a seed meets many.
			o.ReplicaID, o.RefreshInterval = fmt.Sprintf("r%d", i), 30*time.Millisecond
		})[0]
	}

	// The history: every request's real outcome, by key.
	const requests = 120
	var ds [n][]delivery
	keys, failures := 0, 0
	failed := map[string]bool{}
	fl := &flushes{firstSent: map[string]time.Time{}}
	for d := range requests {
		attempts := 1 + rnd.IntN(2)
		for a := 1; a <= attempts; a++ {
			res := breaker.Result{Kind: breaker.KindAnswered, Status: 200}
			if rnd.IntN(2) == 0 {
				res = breaker.Result{Kind: breaker.KindStatus, Status: 503}
				failures++
			}
			res.Key = fmt.Sprintf("%016x:%d", uint64(d)*0x9e3779b97f4a7c15^seed, a)
			failed[res.Key] = res.Kind == breaker.KindStatus
			keys++
			for range 1 + rnd.IntN(3) {
				r := rnd.IntN(n)
				ds[r] = append(ds[r], delivery{replica: r, res: res})
			}
		}
		if rnd.IntN(3) == 0 { // an expiry or a cancel: unkeyed, counts nothing
			r := rnd.IntN(n)
			ds[r] = append(ds[r], delivery{replica: r, res: breaker.Result{Kind: breaker.KindNeither, Reason: breaker.ReasonNoOutcome}})
		}
	}
	for i := range ds {
		rnd.Shuffle(len(ds[i]), func(a, b int) { ds[i][a], ds[i][b] = ds[i][b], ds[i][a] })
	}

	for _, f := range fs {
		f.on.Store(true)
	}
	// Redis pauses now and then, as a fork or a failover pauses it.
	stopPause := make(chan struct{})
	var pauses sync.WaitGroup
	pauses.Add(1)
	go func() {
		defer pauses.Done()
		pr := rand.New(rand.NewPCG(seed, 99))
		for {
			select {
			case <-stopPause:
				return
			case <-time.After(time.Duration(50+pr.IntN(150)) * time.Millisecond):
			}
			_ = base.Do(context.Background(), "CLIENT", "PAUSE", 40+pr.IntN(120), "WRITE").Err()
		}
	}()
	// And Redis is emptied once or twice a seed (FLUSHALL, as an operator
	// or a failover to an empty replica does), while the records go on.
	pauses.Add(1)
	go func() {
		defer pauses.Done()
		pr := rand.New(rand.NewPCG(seed, 77))
		for range 1 + pr.IntN(2) {
			select {
			case <-stopPause:
				return
			case <-time.After(time.Duration(100+pr.IntN(400)) * time.Millisecond):
			}
			if base.Do(context.Background(), "FLUSHALL").Err() == nil {
				fl.mu.Lock()
				fl.n++
				fl.lastEnd = time.Now()
				fl.mu.Unlock()
			}
		}
	}()
	var wg sync.WaitGroup
	ctx := context.Background()
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr := rand.New(rand.NewPCG(seed, uint64(100+i)))
			for _, d := range ds[i] {
				r := rs[d.replica]
				if d.res.Key != "" {
					fl.sent(d.res.Key)
				}
				adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), true)
				_, _ = r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, d.res)
				time.Sleep(time.Duration(pr.IntN(12)) * time.Millisecond) // traffic, not a wait for a state
			}
		}()
	}
	wg.Wait()
	close(stopPause)
	pauses.Wait()
	_ = base.Do(ctx, "CLIENT", "UNPAUSE").Err()
	for _, f := range fs {
		f.on.Store(false)
	}
	for i, f := range fs {
		quietly(t, fmt.Sprintf("replica %d's late calls run", i), func() bool { return f.late.Load() == 0 })
	}
	for i, r := range rs {
		quietly(t, fmt.Sprintf("replica %d quiet", i), r.st.Quiet)
	}
	// Once more: a call that met its failpoint just before they were
	// turned off may have started its late run after the first look.
	for i, f := range fs {
		quietly(t, fmt.Sprintf("replica %d's late calls run", i), func() bool { return f.late.Load() == 0 })
	}
	var hits [failpoints]int64
	for _, f := range fs {
		for k := range hits {
			hits[k] += f.hits[k].Load()
		}
	}
	// A replica that was not in the run reads Redis itself.
	judge := replicasWith(t, srv.Client(t), prefix, clk, p, 1, time.Second, func(_ int, o *redisstore.Options) { o.ReplicaID = "judge" })[0]
	s, err := judge.st.Status(ctx, judge.key, clk.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys (%d failures); failpoints met: %v none, %v refused, %v lost, %v late; %d FLUSHALL", keys, failures,
		hits[fpNone], hits[fpRefused], hits[fpLost], hits[fpLate], fl.n)
	// What Redis holds since the last flush: one record key for each
	// outcome applied, set with its count by the same script and taken
	// with it by FLUSHALL. Exactly once, no slack: the window counts one
	// call per key held, and the failures the failure keys among them.
	held := recMarkers(t, base, prefix)
	heldFailures := 0
	for k := range held {
		if failed[k] {
			heldFailures++
		}
	}
	if s.WindowCalls != int64(len(held)) || s.WindowFailures != int64(heldFailures) {
		t.Fatalf("seed %d: Redis counts %d records (%d failures) for the %d keys (%d failures) it applied since the last flush: one record per key is the promise",
			seed, s.WindowCalls, s.WindowFailures, len(held), heldFailures)
	}
	// And nothing is lost: every key first sent after the last flush
	// ended is applied (all of them when no flush ran).
	lost := 0
	for k, at := range fl.firstSent {
		if at.After(fl.lastEnd) && !held[k] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("seed %d: %d keys first sent after the last flush are not applied", seed, lost)
	}
	if fl.n == 0 && len(held) != keys {
		t.Fatalf("seed %d: no flush, and %d of %d keys applied", seed, len(held), keys)
	}
}

// quietly waits for cond over real time: the replicas' resyncs run on
// their own timers after the faults end.
func quietly(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
