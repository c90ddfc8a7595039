package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// cmdCounter counts the commands a client sends, by name (a pipeline's
// commands one by one): what a replica costs Redis.
type cmdCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func countCommands(c redis.UniversalClient) *cmdCounter {
	cc := &cmdCounter{n: map[string]int{}}
	c.AddHook(cc)
	return cc
}

func (c *cmdCounter) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		name := cmd.Name()
		if (name == "evalsha" || name == "eval") && len(cmd.Args()) > 4 {
			name += " " + cmd.Args()[4].(string) // the script's operation
		}
		c.n[name]++
	}
}

// take returns the counts since the last take, and their total.
func (c *cmdCounter) take() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := c.n, 0
	for _, v := range out {
		total += v
	}
	c.n = map[string]int{}
	return out, total
}

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.add(cmds...)
		return next(ctx, cmds)
	}
}

// A request try_all or the capacity floor sends to an unhealthy route is
// admitted from the local view: no Redis call, so a stalled Redis never
// holds it. Only a forced request that takes a free probe slot asks Redis,
// as every probe does. Before, each forced admission of an open route was
// one script call on the decision path (fails before: one "acq" per call,
// and each waited out the stall).
func TestForcedAdmissionsMakeNoCall(t *testing.T) {
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	client, err := redisstore.NewClient("redis://" + px.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	cc := countCommands(client)
	clk := breaker.NewFakeClock(time.Now())
	ctx := context.Background()
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1; p.HalfOpenMaxProbes = 1 })
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "force:", OpTimeout: time.Second, Clock: clk})
	keys, _, _ := st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	k := keys[0]
	adm, _, _ := st.Acquire(ctx, k, clk.Now().UnixNano(), false)
	if _, err := st.Record(ctx, k, clk.Now().UnixNano(), adm, fail503); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		setup func()
		calls int // script calls the forced admission makes
		lease bool
	}{
		{"open", func() {}, 0, false},
		{"forced open", func() { _ = st.ForceOpen(ctx, k, clk.Now().UnixNano(), time.Minute) }, 0, false},
		{"half-open, slot free: a probe", func() { _ = st.Reset(ctx, k, clk.Now().UnixNano()); fail(t, st, clk, k); clk.Advance(11 * time.Second) }, 1, true},
		{"half-open, slots taken", func() {}, 0, false},
	}
	for _, c := range cases {
		c.setup()
		cc.take()
		px.Stall(c.calls == 0) // a forced admission that needs no slot must not wait for Redis
		start := time.Now()
		adm, ok, err := st.Acquire(ctx, k, clk.Now().UnixNano(), true)
		took := time.Since(start)
		px.Stall(false)
		_, n := cc.take()
		if !ok || err != nil {
			t.Fatalf("%s: forced admission refused (%v)", c.name, err)
		}
		if n != c.calls || (adm.Lease != 0) != c.lease {
			t.Fatalf("%s: %d Redis calls, lease %d; want %d calls, lease %v", c.name, n, adm.Lease, c.calls, c.lease)
		}
		// With no call made (counted above) nothing waited on Redis; the
		// clock only catches a hang (500 ms was a loaded machine's to
		// break).
		if c.calls == 0 && took > 5*time.Second {
			t.Fatalf("%s: the forced admission hung %v on a stalled Redis", c.name, took)
		}
	}
}

func fail(t *testing.T, st *redisstore.Store, clk *breaker.FakeClock, k breaker.Key) {
	t.Helper()
	adm, _, _ := st.Acquire(context.Background(), k, clk.Now().UnixNano(), false)
	if _, err := st.Record(context.Background(), k, clk.Now().UnixNano(), adm, fail503); err != nil {
		t.Fatal(err)
	}
}

// dialer opens a client to one test Redis (a server, a Cluster).
type dialer func(testing.TB) redis.UniversalClient

func serverDialer(srv *redistest.Server) dialer {
	return func(t testing.TB) redis.UniversalClient { return srv.Client(t) }
}

func urlDialer(url string) dialer {
	return func(t testing.TB) redis.UniversalClient {
		c, err := redisstore.NewClient(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// manyBreakers installs n breakers on a started store with its own client
// (its commands counted), and waits for its first snapshot.
func manyBreakers(t testing.TB, dial dialer, prefix string, n int, mod func(*redisstore.Options)) (*redisstore.Store, []breaker.Key, *cmdCounter) {
	t.Helper()
	client := dial(t)
	cc := countCommands(client)
	clk := breaker.NewFakeClock(time.Now())
	o := redisstore.Options{TestClock: true, Client: client, KeyPrefix: prefix, OpTimeout: time.Second, Clock: clk, AsyncRecord: true}
	if mod != nil {
		mod(&o)
	}
	st := redisstore.New(o)
	specs := make([]breaker.Spec, n)
	p := replicaPolicy(nil)
	for i := range specs {
		specs[i] = breaker.Spec{ID: breaker.RouteID("gw", fmt.Sprintf("p%d:r:m", i)), Policy: p}
	}
	keys, _, err := st.Install(context.Background(), clk.Now().UnixNano(), specs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wg := st.Start(ctx)
	t.Cleanup(func() { cancel(); wg.Wait() })
	eventually(t, "ready", st.Ready)
	return st, keys, cc
}

// The periodic refresh costs one call per replica per period whatever the
// number of breakers (#27): it reads the change log's counter, and nothing
// else when nothing changed. Before, it ran one "snap" script per breaker
// every period: 5,000 breakers were 5,000 calls every 2 s per replica
// (fails before: 5,000 calls per period).
func TestIdleRefreshCostDoesNotGrowWithBreakers(t *testing.T) {
	srv := redistest.Start(t)
	for _, n := range []int{50, 5000} {
		const period = 20 * time.Millisecond
		_, _, cc := manyBreakers(t, serverDialer(srv), fmt.Sprintf("idle%d:", n), n, func(o *redisstore.Options) { o.RefreshInterval = period })
		cc.take()
		time.Sleep(20 * period)
		byName, total := cc.take()
		// 20 periods: about 20 reads of the counter; never one per breaker.
		if total > 40 || byName["evalsha snap"] > 0 {
			t.Fatalf("%d breakers: %d commands in 20 refresh periods at idle (%v); want about one per period", n, total, byName)
		}
	}
}

// A change one replica makes reaches another through the refresh alone
// (its feed refused here: the two do not share a signing key), reading
// only the breaker that changed.
func TestRefreshReadsOnlyWhatChanged(t *testing.T) {
	srv := redistest.Start(t)
	a, ak, _ := manyBreakers(t, serverDialer(srv), "chg:", 100, nil)
	b, bk, bc := manyBreakers(t, serverDialer(srv), "chg:", 100, func(o *redisstore.Options) {
		o.RefreshInterval = 20 * time.Millisecond
		o.HMACKey = []byte("not the writer's key: its feed is dropped")
	})
	ctx := context.Background()
	now := time.Now().UnixNano()
	// The first note creates the log (a new epoch): every replica reads
	// every breaker once then.
	if err := a.ForceOpen(ctx, ak[0], now, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first change", func() bool { return !b.Peek(ctx, bk[0], now).Allowed })
	time.Sleep(50 * time.Millisecond)
	bc.take()
	if err := a.ForceOpen(ctx, ak[7], now, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other replica learns the open from its refresh", func() bool { return !b.Peek(ctx, bk[7], now).Allowed })
	time.Sleep(100 * time.Millisecond)
	byName, _ := bc.take()
	if byName["evalsha snap"] > 2 {
		t.Fatalf("the refresh read %d breakers for one change (%v)", byName["evalsha snap"], byName)
	}
}
