package simulate

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The egress scenario's world: two pods share a Redis, and pod A reaches
// the first route through a gate that stands for its egress (a node's
// conntrack table, its DNS cache, an egress proxy). Cut, the gate drops
// every connection it carries and refuses new ones, as a broken egress
// does: Envoy sees a connection failure, a failure of local origin.

// egressGate forwards TCP to a provider until cut.
type egressGate struct {
	target string
	ln     net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newEgressGate(target string) (*egressGate, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &egressGate{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go g.serve(ln)
	return g, nil
}

func (g *egressGate) addr() string { return g.ln.Addr().String() }

func (g *egressGate) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go g.carry(c)
	}
}

func (g *egressGate) carry(c net.Conn) {
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		c.Close()
		return
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	g.conns[c], g.conns[up] = struct{}{}, struct{}{}
	g.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	g.mu.Lock()
	delete(g.conns, c)
	delete(g.conns, up)
	g.mu.Unlock()
}

// cut breaks the egress (on) or mends it: broken, the gate's address
// refuses connections (its listener is closed) and the connections it
// carried are dropped; mended, it listens again on the same address.
func (g *egressGate) cut(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if on == g.closed {
		return
	}
	g.closed = on
	if on {
		g.ln.Close()
		for c := range g.conns {
			c.Close()
		}
		return
	}
	for range 50 {
		ln, err := net.Listen("tcp", g.ln.Addr().String())
		if err == nil {
			g.ln = ln
			go g.serve(ln)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (g *egressGate) close() { g.cut(true) }

// fleetRedis is the Redis the pods share: url when given, else a
// redis-server from PATH on a free port, with nothing kept on disk.
func fleetRedis(url, dir string) (string, func(), error) {
	if url != "" {
		return url, func() {}, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("the egress scenario runs two replicas that share a Redis: pass -redis redis://HOST:PORT/0, or put redis-server on PATH")
	}
	// A port found free can be taken before redis-server binds it (the
	// listener that found it is closed first); redis-server then exits at
	// once, and is started again on another port.
	var last error
	for range 5 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		url, stop, exited, err := startRedis(bin, dir, port)
		if !exited {
			return url, stop, err
		}
		last = err
	}
	return "", nil, last
}

// startRedis runs redis-server on port and waits until it answers PING,
// or exits (exited: try another port), or 30 s pass.
func startRedis(bin, dir string, port int) (url string, stop func(), exited bool, err error) {
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, false, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop = func() { _ = cmd.Process.Kill(); <-done }
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-done:
			return "", nil, true, fmt.Errorf("redis-server exited on %s before answering", addr)
		default:
		}
		if ping(addr) {
			return "redis://" + addr + "/0", stop, false, nil
		}
	}
	stop()
	return "", nil, false, fmt.Errorf("redis-server did not answer on %s", addr)
}

// ping reports whether a Redis answers PING at addr.
func ping(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// waitAlive waits until every pod's fusebox counts n replicas alive
// through the store (fusebox_replicas_alive), at most 20 s.
func waitAlive(pods []*pod, n int) error {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		all := true
		for _, p := range pods {
			all = all && metric([]*pod{p}, "fusebox_replicas_alive") >= float64(n)
		}
		if all {
			return nil
		}
	}
	return fmt.Errorf("the %d replicas did not see each other alive through Redis within 20 s", n)
}
