package redisstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/breaker/storetest"
)

// R-ST12 (in part): the whole contract suite on a real three-master Redis
// Cluster, through the cluster client NewClient builds from ?addrs=: every
// script touches one breaker's key (hash-tagged), so no call is CROSSSLOT.
func TestRedisStoreContractOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cl := redistest.StartCluster(t)
	client, err := redisstore.NewClient(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, onEvent func(breaker.Event)) breaker.Store {
		return redisstore.New(redisstore.Options{Client: client, KeyPrefix: fmt.Sprintf("c%d:", n.Add(1)),
			OpTimeout: 2 * time.Second, OnEvent: onEvent})
	})
}

// Replicas on a Redis Cluster: failures spread over two replicas open the
// breaker once, and the feed (classic pub/sub, which a cluster forwards to
// every node, so a subscriber on any node hears a publish on any other)
// tells the replica that did not make the transition.
func TestReplicasOnCluster(t *testing.T) {
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
	opens := 0
	for _, r := range rs {
		r.mu.Lock()
		for _, e := range r.events {
			if e.To == breaker.Open {
				opens++
			}
		}
		r.mu.Unlock()
	}
	if opens != 1 {
		t.Fatalf("%d closed->open transitions in the fleet, want 1", opens)
	}
}
