package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server.
type Server struct {
	Addr string
	bin  string
	args []string
	cmd  *exec.Cmd
}

// Start runs redis-server for t.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed; with CI=true the Redis tests must run (.ci/run installs it)")
		}
		t.Skip("redis-server is not installed")
	}
	s, err := Launch(t.TempDir())
	if s != nil {
		t.Cleanup(s.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Launch runs redis-server on a free loopback port with its files in dir,
// outside a test (the soak campaign); the caller stops it.
func Launch(dir string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), bin: bin,
		args: []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "yes"}}
	return s, s.run()
}

// run starts redis-server and waits until it answers.
func (s *Server) run() error {
	s.cmd = exec.Command(s.bin, s.args...)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server did not start on %s", s.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// Restart starts the server again on the same address after Stop (its data
// is gone: persistence is off, as after a crash of a cache-only Redis).
func (s *Server) Restart() error {
	s.Stop()
	return s.run()
}

// Stop kills the server.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Client returns a client for the server, closed at the end of the test.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// Pause makes the server stop answering its clients for d (CLIENT PAUSE;
// mode ALL or WRITE), as a fork or a failover does, connected but silent;
// it is unpaused at the end of the test at the latest.
func (s *Server) Pause(t testing.TB, d time.Duration, mode string) {
	t.Helper()
	c := s.Client(t)
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), mode).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Do(context.Background(), "CLIENT", "UNPAUSE") })
}
