package redistest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// A port found free (a listener on 127.0.0.1:0, then closed) can be taken
// before redis-server binds it: the kernel hands the same ephemeral range
// to every outgoing connection of the tests running beside it. redis-server
// then exits at once, and it is started again on another port. A cluster
// node binds a second port, its bus at port+10000 (Redis 7.0's default),
// and refuses a port above 55535; a loaded CI run lost
// TestRedisStoreContractOnCluster to a node that exited and a launcher
// that waited 10 s for it to answer (#54).

const (
	// launchAttempts bounds the fresh ports one server is tried on.
	launchAttempts = 5
	// startBound is a hang bound: redis-server answers in milliseconds.
	startBound = 30 * time.Second
	// probeBound bounds one try of the start's probe; a slow answer is
	// tried again, until startBound.
	probeBound = 250 * time.Millisecond
	// clusterBusOffset is the cluster bus port's distance from the port.
	clusterBusOffset = 10000
)

// ExitError: redis-server exited before it answered.
type ExitError struct {
	Addr string
	Err  error  // the process's end
	Said string // the end of its output
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("redis-server on %s exited before answering (%v): %s", e.Addr, e.Err, e.Said)
}

// launch starts the server build makes for a port pick finds, on a fresh
// port again while redis-server exits before answering.
func launch(pick func() (int, error), build func(port int) (*Server, error)) (*Server, error) {
	var last error
	for range launchAttempts {
		port, err := pick()
		if err != nil {
			return nil, err
		}
		s, err := build(port)
		if err != nil {
			return nil, err
		}
		last = s.run()
		if last == nil {
			return s, nil
		}
		if _, exited := errors.AsType[*ExitError](last); !exited {
			return nil, last
		}
	}
	return nil, fmt.Errorf("%d ports tried: %w", launchAttempts, last)
}

// pickPort finds a free loopback port.
func pickPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// clusterPort wraps pick for a cluster node: a port whose bus port
// (port+10000) exists and is free as well.
func clusterPort(pick func() (int, error)) func() (int, error) {
	return func() (int, error) {
		for range 100 {
			port, err := pick()
			if err != nil {
				return 0, err
			}
			if port+clusterBusOffset > 65535 {
				continue
			}
			ln, err := net.Listen("tcp", loopback(port+clusterBusOffset))
			if err != nil {
				continue
			}
			ln.Close()
			return port, nil
		}
		return 0, errors.New("no free port with a free cluster bus port in 100 tries")
	}
}

func loopback(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

// serverArgs is a data server's command line on port with its files in
// dir, nothing kept on disk, then extra.
func serverArgs(port int, dir string, extra ...string) []string {
	return append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no"}, extra...)
}

// tail is the end of a file redis-server wrote ("" when unreadable).
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	b = bytes.TrimSpace(b)
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return string(b)
}
