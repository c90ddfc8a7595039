package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master, one replica and one sentinel (redis-server
// --sentinel, quorum 1) watching them as "fusebox", stopped at the end of
// the test.
type Sentinel struct {
	Master, Replica, Sentinel *Server
}

// StartSentinel runs the three processes for t (skipped without
// redis-server, unless CI=true).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin := Need(t, "redis-server")
	s := &Sentinel{}
	// The processes' files live under one directory made before their
	// stop is registered: cleanups run last-first, so they are stopped
	// before it is removed. Before, a replica writing its sync file made
	// the directory's removal fail TestSentinelFailover (CI, stop 33).
	base := t.TempDir()
	t.Cleanup(func() {
		for _, n := range []*Server{s.Sentinel, s.Replica, s.Master} {
			if n != nil {
				n.Stop()
			}
		}
	})
	node := func(name string, args func(port int, dir string) ([]string, error)) *Server {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n, err := launch(pickPort, func(port int) (*Server, error) {
			a, err := args(port, dir)
			return &Server{Addr: loopback(port), bin: bin, out: filepath.Join(dir, "redis-server.out"), args: a}, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	data := func(extra ...string) func(int, string) ([]string, error) {
		return func(port int, dir string) ([]string, error) {
			return serverArgs(port, dir, extra...), nil
		}
	}
	s.Master = node("master", data())
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	s.Replica = node("replica", data("--replicaof", host, port))
	// The sentinel's config file must be writable (it rewrites it), and
	// names its port: it is written for each port tried.
	s.Sentinel = node("sentinel", func(sport int, dir string) ([]string, error) {
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor fusebox %s %s 1\nsentinel down-after-milliseconds fusebox 1000\nsentinel failover-timeout fusebox 5000\n", sport, host, port)
		return []string{conf, "--sentinel"}, os.WriteFile(conf, []byte(body), 0o600)
	})
	// Wait until the replica is in sync and the sentinel knows the master.
	deadline := time.Now().Add(15 * time.Second)
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr})
	defer sc.Close()
	for {
		addr, err := sc.GetMasterAddrByName(context.Background(), "fusebox").Result()
		if err == nil && len(addr) == 2 && addr[1] == port {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel never reported the master: %v %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// URL is the store.redis.url that reaches the master through the
// sentinel (?master_name=).
func (s *Sentinel) URL() string {
	return "redis://" + s.Sentinel.Addr + "?master_name=fusebox&addrs=" + s.Sentinel.Addr
}
