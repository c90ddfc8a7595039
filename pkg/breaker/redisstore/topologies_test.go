package redisstore_test

import (
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/breaker/storetest"
	"github.com/redis/go-redis/v9"
)

// R-ST12 (in part): the whole contract suite on a real three-master Redis
// Cluster, through the cluster client NewClient builds from ?addrs=: every
// script touches one breaker's key (hash-tagged), so no call is CROSSSLOT.
func TestRedisStoreContractOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	contractThrough(t, redistest.StartCluster(t).URL(), "c")
}

// contractThrough runs the contract suite on stores sharing one client
// made from url, each test under its own key prefix.
func contractThrough(t *testing.T, url, prefix string) {
	client, err := redisstore.NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, onEvent func(breaker.Event)) breaker.Store {
		return redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: fmt.Sprintf("%s%d:", prefix, n.Add(1)),
			OpTimeout: 2 * time.Second, OnEvent: onEvent})
	})
}

// Replicas on a Redis Cluster: failures spread over two replicas open the
// breaker once, and the feed (classic pub/sub, which a cluster forwards to
// every node, so a subscriber on any node hears a publish on any other)
// tells the replica that did not make the transition.
// Through a Sentinel the same holds, with the failover client.
func TestReplicasOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	replicasOpenOnce(t, redistest.StartCluster(t).URL())
}

func TestReplicasThroughSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a sentinel")
	}
	replicasOpenOnce(t, redistest.StartSentinel(t).URL())
}

func replicasOpenOnce(t *testing.T, url string) {
	client, err := redisstore.NewClient(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 4 })
	rs := replicas(t, client, "cl:", clk, p, 2, 2*time.Second)
	ctx := t.Context()
	for i := range 4 {
		r := rs[i%2]
		adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
		if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, fail503); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range rs {
		eventually(t, fmt.Sprintf("replica %d sees the open", i), func() bool {
			return !r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed
		})
	}
	if opens := countEvents(rs, func(e breaker.Event) bool { return e.To == breaker.Open }); opens != 1 {
		t.Fatalf("%d closed->open transitions in the fleet, want 1", opens)
	}
}

// The whole contract suite through a Sentinel (master, replica, sentinel),
// with the failover client NewClient builds from ?master_name=.
func TestRedisStoreContractThroughSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a sentinel")
	}
	contractThrough(t, redistest.StartSentinel(t).URL(), "s")
}

// A Sentinel failover under load: the replica is promoted, the failover
// client follows it, and the store goes on — records reach the new master
// and the breaker opens on the failures made before and after the
// failover. Decisions made throughout never wait longer than
// op_timeout_ms. What the old master had not
// yet replicated is lost with it (Redis replication is asynchronous);
// the replicas' views then take the new master's state (a key whose
// incarnation changed is taken whatever its sequence, R-ST8), and an open
// a replica learned locally meanwhile is written back.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a master, a replica and a sentinel")
	}
	sn := redistest.StartSentinel(t)
	client, err := redisstore.NewClient(sn.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	waits := &decisionWaits{opTimeout: 200 * time.Millisecond}
	client.AddHook(waits)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 6 })
	r := replicas(t, client, "sf:", clk, p, 1, waits.opTimeout)[0]
	ctx := t.Context()
	fail := func(n int) {
		for range n {
			adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
			_, _ = r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, fail503)
		}
	}
	fail(3)
	eventually(t, "three failures in Redis", func() bool {
		st, err := r.st.Status(ctx, r.key, clk.Now().UnixNano())
		return err == nil && st.Failures == 3
	})
	// Let the replica catch up, then fail over.
	mc := redis.NewClient(&redis.Options{Addr: sn.Master.Addr})
	defer mc.Close()
	if err := mc.Do(ctx, "WAIT", 1, 2000).Err(); err != nil {
		t.Fatal(err)
	}
	// Decisions run throughout the failover: none may wait for Redis
	// longer than op_timeout_ms (200 ms here).
	var slowest atomic.Int64
	stop := make(chan struct{})
	decided := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				decided <- n
				return
			default:
			}
			t0 := time.Now()
			dctx, dw := waits.decision(ctx)
			r.st.Peek(dctx, r.key, clk.Now().UnixNano())
			adm, _, _ := r.st.Acquire(dctx, r.key, clk.Now().UnixNano(), false)
			if d := time.Since(t0); int64(d) > slowest.Load() {
				slowest.Store(int64(d))
			}
			waits.done(dw)
			_, _ = r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, breaker.Result{Kind: breaker.KindAnswered, Status: 200})
			n++
			time.Sleep(100 * time.Microsecond)
		}
	}()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sn.Sentinel.Addr})
	defer sc.Close()
	if err := sc.Failover(ctx, "fusebox").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sentinel promotes the replica", func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, "fusebox").Result()
		return err == nil && len(addr) == 2 && "127.0.0.1:"+addr[1] == sn.Replica.Addr
	})
	close(stop)
	// Judged by the deadlines the decisions' Redis commands ran under,
	// not the wall clock: on a loaded machine a decision woken by Redis's
	// answer may wait to run past any bound near op_timeout.
	n := <-decided
	t.Logf("%d decisions during the failover (%d waited on Redis), the slowest %v", n, waits.waited.Load(), time.Duration(slowest.Load()))
	if n == 0 {
		t.Fatal("no decision during the failover")
	}
	waits.check(t, time.Duration(slowest.Load()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		fail(1)
		st, err := r.st.Status(ctx, r.key, clk.Now().UnixNano())
		if err == nil && st.State == "open" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never opened after the failover: %+v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A reshard of a breaker's slot under load loses no outcome: while
// records run, the slot moves to another master (SETSLOT IMPORTING /
// MIGRATING, MIGRATE, SETSLOT NODE); go-redis follows the ASK and MOVED
// redirects.
func TestClusterReshardUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t)
	client, err := redisstore.NewClient(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1000000 })
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "rs:", OpTimeout: 2 * time.Second, Clock: clk})
	ctx := t.Context()
	keys, _, err := st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	if err != nil {
		t.Fatal(err)
	}
	k := keys[0]
	const n = 1500
	var recorded atomic.Int64
	done := make(chan error, 1)
	go func() {
		for range n {
			recorded.Add(1)
			adm, _, _ := st.Acquire(ctx, k, clk.Now().UnixNano(), false)
			if _, err := st.Record(ctx, k, clk.Now().UnixNano(), adm, fail503); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	// Move the breaker's slot to another master while the records run.
	redisKey := st.Key(replicaID)
	node := func(addr string) *redis.Client { return redis.NewClient(&redis.Options{Addr: addr}) }
	slot, err := node(cl.Nodes[0].Addr).ClusterKeySlot(ctx, redisKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	var from, to *redis.Client
	var fromID, toID, toAddr string
	for _, nd := range cl.Nodes {
		c := node(nd.Addr)
		defer c.Close()
		id, _ := c.ClusterMyID(ctx).Result()
		master, _ := redistest.MasterID(ctx, c, slot)
		owner := master != "" && master == id
		if owner && from == nil {
			from, fromID = c, id
		} else if !owner && to == nil {
			to, toID, toAddr = c, id, nd.Addr
		}
	}
	time.Sleep(20 * time.Millisecond) // some records land before the move
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	before := recorded.Load()
	must(to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID).Err())
	must(from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID).Err())
	host, port, _ := net.SplitHostPort(toAddr)
	for {
		ks, err := from.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		must(err)
		if len(ks) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, kk := range ks {
			args = append(args, kk)
		}
		must(from.Do(ctx, args...).Err())
	}
	for _, nd := range cl.Nodes {
		c := node(nd.Addr)
		must(c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", toID).Err())
		c.Close()
	}
	after := recorded.Load()
	if before == 0 || after >= n {
		t.Fatalf("the move did not happen under load: %d records before it, %d when it ended, of %d", before, after, n)
	}
	if err := <-done; err != nil {
		t.Fatalf("a record failed during the reshard: %v", err)
	}
	s, err := st.Status(ctx, k, clk.Now().UnixNano())
	if err != nil || s.Failures != n {
		t.Fatalf("%d of %d failures in Redis after the reshard (%v)", s.Failures, n, err)
	}
}

// The feed on a Cluster survives the failure of the master its
// subscription is on: the master's replica is promoted, go-redis
// resubscribes there, and transitions made afterwards still reach the
// other replica by the feed alone (its refresh is an hour). The feed is
// classic pub/sub, not sharded (SSUBSCRIBE): a classic message is
// broadcast to every node, so a subscriber on any live node hears it;
// a sharded channel lives in one shard and is heard only while that
// shard has a master (docs/replicas.md).
func TestFeedSurvivesAClusterMasterFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	cl := redistest.StartClusterWithReplicas(t)
	clk := breaker.NewFakeClock(time.Now())
	p := replicaPolicy(nil)
	var rs []*replica
	for i := range 2 {
		client, err := redisstore.NewClient(cl.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		rs = append(rs, replicasWith(t, client, "ff:", clk, p, 1, 500*time.Millisecond, func(_ int, o *redisstore.Options) {
			o.ReplicaID = fmt.Sprintf("ff%d", i)
			o.RefreshInterval = time.Hour // only the feed can tell it
		})[0])
	}
	a, b := rs[0], rs[1]
	ctx := t.Context()
	flip := func(round string) {
		t.Helper()
		if err := a.st.ForceOpen(ctx, a.key, clk.Now().UnixNano(), time.Hour); err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		eventually(t, round+": the open reaches the other replica", func() bool { return !b.st.Peek(ctx, b.key, clk.Now().UnixNano()).Allowed })
		if err := a.st.ForceClose(ctx, a.key, clk.Now().UnixNano()); err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		eventually(t, round+": the close reaches the other replica", func() bool { return b.st.Peek(ctx, b.key, clk.Now().UnixNano()).Allowed })
	}
	flip("before the failure")
	slot := int(crc16Slot("ff:feed"))
	master, err := cl.MasterOf(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	master.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, err := cl.MasterOf(ctx, slot)
		if err == nil && m != master {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica of the feed's master was never promoted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Twice: the resubscription's resync reads Redis once; the second
	// round can only come by the feed.
	for _, round := range []string{"after the failover", "again"} {
		deadline := time.Now().Add(15 * time.Second)
		for {
			// A call that went to the dead master turned a store degraded;
			// its refresh (run here: the period is an hour) finds Redis
			// again.
			a.st.Refresh(ctx)
			b.st.Refresh(ctx)
			if !a.st.Degraded() && !b.st.Degraded() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the stores never used the promoted master")
			}
			time.Sleep(100 * time.Millisecond)
		}
		flip(round)
	}
}

// crc16Slot is the Cluster slot of a key with no hash tag (CRC16 mod
// 16384, as CLUSTER KEYSLOT says).
func crc16Slot(key string) uint16 {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
