package mainlib

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// The ext_proc listener on a Unix domain socket (Envoy's pipe address)
// serves on both transports, with the mode it was given, and takes the
// place of a socket a dead process left behind.
func TestGRPCOnAUnixSocket(t *testing.T) {
	for _, server := range []string{"fusebox", "grpc-go"} {
		t.Run(server, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "extproc.sock")
			// A socket left by a process that is gone.
			stale, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			stale.(*net.UnixListener).SetUnlinkOnClose(false)
			stale.Close()

			good, err := os.ReadFile("../../../pkg/routes/default.yaml")
			if err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "fusebox.yaml")
			doc := strings.Replace(string(good), "listen:\n", "listen:\n  grpc_socket: {mode: \"0600\"}\n", 1)
			if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			logs := &syncBuffer{}
			in, err := Start(ctx, []string{"-config", cfg, "-grpc-addr", "unix://" + sock, "-admin-addr", "127.0.0.1:0",
				"-grace-period", "0s", "-grpc-server", server}, logs)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- in.Wait() }()
			if got := in.GRPCAddr(); got != "unix://"+sock {
				t.Fatalf("GRPCAddr %q", got)
			}
			if st := grpcHealth(t, in.GRPCAddr()); st != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("grpc health %v", st)
			}
			fi, err := os.Stat(sock)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
			}
			if strings.Contains(logs.String(), "is not loopback") {
				t.Fatalf("a Unix socket was warned about as a network listener:\n%s", logs)
			}
			// A second instance on the same live socket is refused, not
			// handed the first one's socket.
			if _, err := listenGRPC("unix://"+sock, routes.SocketSpec{}); err == nil || !strings.Contains(err.Error(), "in use") {
				t.Fatalf("a live socket was taken over: %v", err)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(sock); !os.IsNotExist(err) {
				t.Fatalf("the socket is left after a clean stop: %v", err)
			}
		})
	}
}

func TestUnixSocketRefusals(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, addr string
		sock       routes.SocketSpec
		want       string
	}{
		{"a file that is not a socket is never removed", "unix://" + file, routes.SocketSpec{}, "not a socket"},
		{"an unknown owner", "unix://" + filepath.Join(dir, "a.sock"), routes.SocketSpec{Owner: "no-such-user-fusebox"}, "listen.grpc_socket.owner"},
		{"an unknown group", "unix://" + filepath.Join(dir, "b.sock"), routes.SocketSpec{Group: "no-such-group-fusebox"}, "listen.grpc_socket.group"},
		{"a bad mode", "unix://" + filepath.Join(dir, "c.sock"), routes.SocketSpec{Mode: "0999"}, "listen.grpc_socket.mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := listenGRPC(tc.addr, tc.sock)
			if err == nil {
				ln.Close()
				t.Fatal("listened")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q", err, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(file); string(b) != "x" {
		t.Fatal("the plain file was touched")
	}
}
