package routes

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
)

func (c *compiler) checkListen(f *File) {
	for _, a := range []struct{ field, v string }{{"listen.grpc", f.Listen.GRPC}, {"listen.admin", f.Listen.Admin}} {
		if p, ok := UnixSocketPath(a.v); ok && a.field == "listen.grpc" {
			// sun_path holds 108 bytes with its NUL on Linux.
			if !strings.HasPrefix(p, "/") || len(p) > 107 || strings.ContainsRune(p, 0) {
				c.errf("%s: %q: a Unix socket is unix:///absolute/path, at most 107 bytes", a.field, a.v)
			}
			continue
		}
		if strings.HasPrefix(a.v, "unix:") {
			c.errf("%s: %q: only listen.grpc can be a Unix socket (unix:///absolute/path)", a.field, a.v)
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			c.errf("%s: %q is not host:port (%v)", a.field, a.v, err)
		}
	}
	if _, err := ParseSocketMode(f.Listen.GRPCSocket.Mode); err != nil {
		c.errf("listen.grpc_socket.mode: %v", err)
	}
}

// ParseSocketMode reads an octal file mode of at most 0777.
func ParseSocketMode(s string) (os.FileMode, error) {
	if s == "" {
		s = DefaultSocketMode
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return 0, fmt.Errorf("%q is not an octal mode of at most 0777", s)
	}
	return os.FileMode(v), nil
}

func (c *compiler) checkLimits(f *File) {
	if v := f.Limits.MaxMessageBytes; v != nil && (*v < MinMaxMessageBytes || *v > 1<<30) {
		c.errf("limits.max_message_bytes: must be in %d..%d (Envoy's 16 MiB request buffer plus framing must fit), got %d", MinMaxMessageBytes, 1<<30, *v)
	}
	if v := f.Limits.MaxConcurrentStreams; v != nil && (*v < 1 || *v > 10000000) {
		c.errf("limits.max_concurrent_streams: must be in 1..10000000, got %d", *v)
	}
	if v := f.Limits.MaxConfigBytes; v != nil && (*v < 4096 || *v > MaxMaxConfigBytes) {
		c.errf("limits.max_config_bytes: must be in 4096..%d, got %d", MaxMaxConfigBytes, *v)
	}
	if v := f.Limits.MaxStreamIdleSec; v != nil && (*v < 1 || *v > 86400) {
		c.errf("limits.max_stream_idle_sec: must be in 1..86400, got %d", *v)
	}
	if v := f.Limits.MaxStreamDurationSec; v != nil && (*v < 1 || *v > 7*86400) {
		c.errf("limits.max_stream_duration_sec: must be in 1..%d, got %d", 7*86400, *v)
	}
	t := f.Listen.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		c.errf("listen.tls: cert_file and key_file go together")
	}
	if t.ClientCAFile != "" && t.CertFile == "" {
		c.errf("listen.tls.client_ca_file: needs cert_file and key_file (mutual TLS is TLS first)")
	}
}

func (c *compiler) checkStore(f *File) {
	switch f.Store.Backend {
	case StoreMemory, StoreRedis:
	default:
		c.errf("store.backend: must be memory or redis, got %q", f.Store.Backend)
	}
	u, err := url.Parse(f.Store.Redis.URL)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		c.errf("store.redis.url: must be a redis:// or rediss:// URL, got %q", f.Store.Redis.URL)
	}
	if t := f.Store.Redis.OpTimeoutMs; t != nil && *t < 1 {
		c.errf("store.redis.op_timeout_ms: must be a whole number ≥1, got %d", *t)
	}
}

func (c *compiler) checkHeaders(f *File) {
	h := f.Headers
	seen := map[string]string{}
	for _, p := range []struct{ field, v string }{
		{"gateway", h.Gateway}, {"model", h.Model}, {"residency", h.Residency},
		{"cluster", h.Cluster}, {"route", h.Route}, {"fallbacks", h.Fallbacks},
	} {
		if !validHeaderName(p.v) {
			c.errf("headers.%s: %q is not a lower-case HTTP header name", p.field, p.v)
		} else if reservedHeader(p.v) {
			// R-L8: fusebox would rewrite or read a header Envoy owns.
			c.errf("headers.%s: %q is reserved (host, content-length, x-envoy-* and pseudo-headers cannot be used)", p.field, p.v)
		}
		if other, dup := seen[p.v]; dup {
			c.errf("headers.%s: %q is already used by headers.%s", p.field, p.v, other)
		}
		seen[p.v] = p.field
	}
}
