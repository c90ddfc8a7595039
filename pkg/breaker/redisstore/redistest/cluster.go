package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a running three-master Redis Cluster (with or without a
// replica per master): three (or six)
// redis-server --cluster-enabled on free ports, slots assigned with
// redis-cli --cluster create, stopped at the end of the test.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs a Redis Cluster for t (skipped without redis-server
// and redis-cli, unless CI=true).
func StartCluster(t testing.TB) *Cluster { return startCluster(t, 0) }

// StartClusterWithReplicas runs three masters with a replica each (six
// servers), so that a master's failure promotes its replica, as in a
// production Cluster.
func StartClusterWithReplicas(t testing.TB) *Cluster { return startCluster(t, 1) }

// MasterOf returns the node serving slot now, asked of a live node.
func (c *Cluster) MasterOf(ctx context.Context, slot int) (*Server, error) {
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		id, err := MasterID(ctx, cl, int64(slot))
		cl.Close()
		if err != nil || id == "" {
			continue
		}
		for _, m := range c.Nodes {
			if m.cmd == nil {
				continue
			}
			mc := redis.NewClient(&redis.Options{Addr: m.Addr})
			mid, _ := mc.ClusterMyID(ctx).Result()
			mc.Close()
			if mid == id {
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("no live node knows the master of slot %d", slot)
}

// MasterID returns the ID of the master serving slot, as cl's node sees
// the cluster (CLUSTER SHARDS; "" when no master serves it).
func MasterID(ctx context.Context, cl *redis.Client, slot int64) (string, error) {
	shards, err := cl.ClusterShards(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				for _, n := range sh.Nodes {
					if n.Role == "master" && n.Health == "online" {
						return n.ID, nil
					}
				}
			}
		}
	}
	return "", nil
}

func startCluster(t testing.TB, replicas int) *Cluster {
	t.Helper()
	bin := Need(t, "redis-server", "redis-cli")
	c := &Cluster{}
	// The nodes' files live under one directory made before the stop is
	// registered: cleanups run last-first, so the nodes are stopped before
	// it is removed (a node still writing made RemoveAll fail the test).
	base := t.TempDir()
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			n.Stop()
		}
	})
	var addrs []string
	for i := range 3 * (1 + replicas) {
		dir := filepath.Join(base, fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		s, err := launch(clusterPort(pickPort), func(port int) (*Server, error) {
			return &Server{Addr: loopback(port), bin: bin, out: filepath.Join(dir, "redis-server.out"),
				args: serverArgs(port, dir, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "2000")}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", fmt.Sprint(replicas), "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, a := range addrs {
		cl := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, _ := cl.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				t.Fatalf("the cluster never became ok on %s: %s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// A replica that has not synced yet cannot be promoted: wait for
		// its link to its master.
		for replicas > 0 {
			info, _ := cl.Info(context.Background(), "replication").Result()
			if !strings.Contains(info, "role:slave") || strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				t.Fatalf("the replica %s never synced: %s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cl.Close()
	}
	return c
}

// URL is the store.redis.url of the cluster (?addrs=).
func (c *Cluster) URL() string {
	var addrs []string
	for _, n := range c.Nodes {
		addrs = append(addrs, n.Addr)
	}
	return "redis://" + addrs[0] + "?addrs=" + strings.Join(addrs, ",")
}
