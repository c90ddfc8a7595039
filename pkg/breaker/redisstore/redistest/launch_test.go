package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// holdPort keeps a loopback port taken until the test ends.
func holdPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func plainServer(bin, dir string, port int, extra ...string) *Server {
	return &Server{Addr: loopback(port), bin: bin, out: filepath.Join(dir, "redis-server.out"),
		args: serverArgs(port, dir, extra...)}
}

// A redis-server that cannot start is reported as it exits, with its own
// words, for each reason a loaded CI run met: its port taken between the
// pick and the bind, and a cluster node's port too high for its bus port.
// Before, the launcher pinged the dead process for 10 s and said only
// "did not start" (TestRedisStoreContractOnCluster, #54).
func TestAnEarlyExitSaysWhy(t *testing.T) {
	bin := Need(t, "redis-server")
	high := 0
	for p := 60001; p < 60100 && high == 0; p++ {
		if ln, err := net.Listen("tcp", loopback(p)); err == nil {
			ln.Close()
			high = p
		}
	}
	if high == 0 {
		t.Fatal("no free port in 60001-60099")
	}
	for _, tc := range []struct {
		name, says string
		port       int
		extra      []string
	}{
		{"port taken", "Address already in use", holdPort(t), nil},
		{"cluster port above 55535", "port number too high", high, []string{"--cluster-enabled", "yes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := plainServer(bin, dir, tc.port, append(tc.extra, "--cluster-config-file", filepath.Join(dir, "nodes.conf"))...)
			err := s.run()
			s.Stop()
			ee, ok := errors.AsType[*ExitError](err)
			if !ok || !strings.Contains(ee.Said, tc.says) {
				t.Fatalf("want an exit saying %q, got %v", tc.says, err)
			}
		})
	}
}

// launch starts the server again on a fresh port when the first one was
// taken before redis-server could bind it.
func TestLaunchMovesOffATakenPort(t *testing.T) {
	bin := Need(t, "redis-server")
	taken := holdPort(t)
	dir := t.TempDir()
	picks := 0
	s, err := launch(func() (int, error) {
		if picks++; picks == 1 {
			return taken, nil
		}
		return pickPort()
	}, func(port int) (*Server, error) { return plainServer(bin, dir, port), nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if picks != 2 || s.Addr == loopback(taken) {
		t.Fatalf("%d picks, running on %s (taken: %d)", picks, s.Addr, taken)
	}
	if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// A server that exits on every port tried gives up, saying why.
	_, err = launch(func() (int, error) { return taken, nil }, func(port int) (*Server, error) { return plainServer(bin, dir, port), nil })
	if ee, ok := errors.AsType[*ExitError](err); !ok || !strings.Contains(err.Error(), fmt.Sprintf("%d ports tried", launchAttempts)) {
		t.Fatalf("want %d exits, got %v (%v)", launchAttempts, err, ee)
	}
}

// A cluster node's port leaves room for its bus port: neither above 55535
// nor one whose port+10000 is taken.
func TestClusterPortLeavesRoomForTheBus(t *testing.T) {
	var busTaken int
	for busTaken == 0 {
		// A port whose bus port this test can hold.
		p, err := pickPort()
		if err != nil {
			t.Fatal(err)
		}
		if ln, err := net.Listen("tcp", loopback(p+clusterBusOffset)); err == nil && p+clusterBusOffset <= 65535 {
			t.Cleanup(func() { ln.Close() })
			busTaken = p
		}
	}
	script := []int{60001, busTaken}
	pick := func() (int, error) {
		if len(script) > 0 {
			p := script[0]
			script = script[1:]
			return p, nil
		}
		return pickPort()
	}
	port, err := clusterPort(pick)()
	if err != nil {
		t.Fatal(err)
	}
	if port == 60001 || port == busTaken || port+clusterBusOffset > 65535 || len(script) != 0 {
		t.Fatalf("picked %d (refused 60001 and %d?), script left %v", port, busTaken, script)
	}
}
