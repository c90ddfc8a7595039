package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
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

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// StartSentinel runs the three processes for t (skipped without
// redis-server, unless CI=true).
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed; with CI=true the Sentinel tests must run")
		}
		t.Skip("redis-server is not installed")
	}
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
	node := func(name string, extra ...string) *Server {
		port := freePort(t)
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), bin: bin,
			args: append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no"}, extra...)}
		if err := n.run(); err != nil {
			t.Fatal(err)
		}
		return n
	}
	s.Master = node("master")
	host, port, _ := net.SplitHostPort(s.Master.Addr)
	s.Replica = node("replica", "--replicaof", host, port)
	// The sentinel's config file must be writable (it rewrites it).
	sport := freePort(t)
	dir := filepath.Join(base, "sentinel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor fusebox %s %s 1\nsentinel down-after-milliseconds fusebox 1000\nsentinel failover-timeout fusebox 5000\n", sport, host, port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Sentinel = &Server{Addr: fmt.Sprintf("127.0.0.1:%d", sport), bin: bin, args: []string{conf, "--sentinel"}}
	if err := s.Sentinel.run(); err != nil {
		t.Fatal(err)
	}
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
