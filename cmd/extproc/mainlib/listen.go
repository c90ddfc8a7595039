package mainlib

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// listenGRPC opens the ext_proc listener: TCP for host:port, a Unix
// domain socket for unix:///path (Envoy's pipe address).
func listenGRPC(addr string, sock routes.SocketSpec) (net.Listener, error) {
	path, ok := routes.UnixSocketPath(addr)
	if !ok {
		return net.Listen("tcp", addr)
	}
	mode, err := routes.ParseSocketMode(sock.Mode)
	if err != nil {
		return nil, fmt.Errorf("listen.grpc_socket.mode: %w", err)
	}
	uid, gid, err := socketOwner(sock)
	if err != nil {
		return nil, err
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// The socket is made with the process's umask; until the mode and
	// owner below are set, no one but this user can connect (connect needs
	// write permission on the socket), so nothing wider slips in meanwhile.
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen.grpc_socket.mode: %w", err)
	}
	if uid >= 0 || gid >= 0 {
		if err := os.Lchown(path, uid, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("listen.grpc_socket: owner/group: %w", err)
		}
	}
	return ln, nil
}

// removeStaleSocket removes a socket file left by a process that is gone
// (a crash, a kill -9), so a restart can listen again; a live one, or a
// path that is not a socket, is an error rather than taken over.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("listen.grpc: %s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("listen.grpc: %s is in use by another process", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("listen.grpc: %s: %w", path, err)
	}
	return os.Remove(path)
}

// socketOwner resolves the configured owner and group (a name or a
// number); -1 leaves one as it is.
func socketOwner(s routes.SocketSpec) (uid, gid int, err error) {
	uid, gid = -1, -1
	if s.Owner != "" {
		if uid, err = strconv.Atoi(s.Owner); err != nil {
			u, lerr := user.Lookup(s.Owner)
			if lerr != nil {
				return 0, 0, fmt.Errorf("listen.grpc_socket.owner: %w", lerr)
			}
			uid, _ = strconv.Atoi(u.Uid)
		}
	}
	if s.Group != "" {
		if gid, err = strconv.Atoi(s.Group); err != nil {
			g, lerr := user.LookupGroup(s.Group)
			if lerr != nil {
				return 0, 0, fmt.Errorf("listen.grpc_socket.group: %w", lerr)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	return uid, gid, nil
}

// dialTarget is the listener's address as a gRPC client names it: the
// host:port, or unix:///path.
func dialTarget(a net.Addr) string {
	if u, ok := a.(*net.UnixAddr); ok {
		return "unix://" + u.Name
	}
	return a.String()
}
