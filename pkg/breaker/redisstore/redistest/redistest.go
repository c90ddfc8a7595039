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

// Server is a running redis-server.
type Server struct {
	Addr string
	bin  string
	args []string
	// out is the file redis-server's own output goes to, read when it
	// exits before answering.
	out string
	cmd *exec.Cmd
	// exited is closed when the process is gone (waitErr is its end).
	exited  chan struct{}
	waitErr error
}

// Need returns the path of the first of bins, after looking each up on
// PATH. Without one the test is skipped, unless CI=true, where it fails:
// .ci/run installs them, and a Redis test that skips there proves nothing.
func Need(t testing.TB, bins ...string) string {
	t.Helper()
	var first string
	for i, bin := range bins {
		path, err := exec.LookPath(bin)
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed; with CI=true the tests that need it must run (.ci/run installs it)", bin)
			}
			t.Skipf("%s is not installed", bin)
		}
		if i == 0 {
			first = path
		}
	}
	return first
}

// Start runs redis-server for t.
func Start(t testing.TB) *Server {
	t.Helper()
	Need(t, "redis-server")
	s, err := Launch(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Launch runs redis-server on a free loopback port with its files in dir,
// outside a test (the soak campaign); the caller stops it.
func Launch(dir string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	return launch(pickPort, func(port int) (*Server, error) {
		return &Server{Addr: loopback(port), bin: bin, out: filepath.Join(dir, "redis-server.out"),
			args: serverArgs(port, dir, "--protected-mode", "yes")}, nil
	})
}

// run starts redis-server and waits until it answers. A process that
// exits first is reported at once, with what it said (ExitError); one
// that neither answers nor exits within startBound is killed.
func (s *Server) run() error {
	s.cmd = exec.Command(s.bin, s.args...)
	if s.out != "" {
		f, err := os.Create(s.out)
		if err != nil {
			return err
		}
		defer f.Close() // the child holds its own descriptor
		s.cmd.Stdout, s.cmd.Stderr = f, f
	}
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return err
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		s.waitErr = cmd.Wait()
		close(exited)
	}(s.cmd, s.exited)
	ctx, cancel := context.WithTimeout(context.Background(), startBound)
	defer cancel()
	answered := make(chan error, 1)
	go func() { answered <- s.waitAnswer(ctx) }()
	select {
	case err := <-answered:
		if err != nil {
			s.Stop()
			return fmt.Errorf("redis-server neither answered nor exited on %s in %v: %w", s.Addr, startBound, err)
		}
		return nil
	case <-s.exited:
		cancel()
		<-answered
		s.cmd = nil
		return &ExitError{Addr: s.Addr, Err: s.waitErr, Said: tail(s.out)}
	}
}

// waitAnswer waits until this process answers on s.Addr: its INFO names
// its pid. Whatever else holds the port (a listener that never answers,
// another test's Redis) is not taken for it, and the wait goes on while
// run watches the process exit.
func (s *Server) waitAnswer(ctx context.Context) error {
	// Short bounds per try, no retries inside one: a port held by a
	// listener that never answers must not hold the wait past the
	// process's exit (run waits for this to return).
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: probeBound, ReadTimeout: probeBound,
		WriteTimeout: probeBound, MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	want := fmt.Sprintf("process_id:%d\r\n", s.cmd.Process.Pid)
	for {
		info, err := c.Info(ctx, "server").Result()
		if err == nil && strings.Contains(info, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Restart starts the server again on the same address after Stop (its data
// is gone: persistence is off, as after a crash of a cache-only Redis).
func (s *Server) Restart() error {
	s.Stop()
	return s.run()
}

// Stop kills the server and waits for it to be gone.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
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
