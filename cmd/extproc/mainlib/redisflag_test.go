package mainlib

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestRedisURLFlagSelectsRedis: -redis-url with store.backend memory in the
// file runs on Redis (logged); before, fusebox silently ran on memory while
// its operator believed the replicas shared state. A reload of the same
// file then warns about nothing.
func TestRedisURLFlagSelectsRedis(t *testing.T) {
	srv := redistest.Start(t)
	good, err := os.ReadFile("../../../pkg/routes/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(good), "backend: memory") {
		t.Fatal("the default config is not on the memory store")
	}
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	in, err := Start(ctx, []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0",
		"-grace-period", "0s", "-redis-url", "redis://" + srv.Addr + "/0"}, logs, WithOverlayCache(""))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() { cancel(); _ = in.Wait() }()
	waitFor(t, "the Redis store is ready", func() bool {
		_, body := get(t, "http://"+in.AdminAddr()+"/readyz", "")
		return strings.Contains(body, `"store":{"ready":true,"detail":"redis"`)
	})
	if !strings.Contains(logs.String(), "-redis-url selects store.backend redis") {
		t.Fatalf("not logged:\n%s", logs.String())
	}
	// A SIGHUP-style reload of the unchanged file changes nothing and warns
	// of no start-only setting.
	if err := os.WriteFile(path, append(good, []byte("\n# touched\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reload", func() bool { return strings.Contains(logs.String(), "[config] reloaded") })
	if strings.Contains(logs.String(), "takes effect only at start") {
		t.Fatalf("a reload of the same file warned of a start-only change:\n%s", logs.String())
	}
}

// R-X10: the failover deployment on Redis needs a fleet key, since every
// replica must open the attempt tokens the others seal; without one,
// start-up fails naming both settings (through -redis-url too).
func TestFailoverOnRedisNeedsAFleetKey(t *testing.T) {
	good, err := os.ReadFile("../../../pkg/routes/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(path, append([]byte("envoy: {failover: true}\n"), good...), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Start(context.Background(), []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0",
		"-grace-period", "0s", "-redis-url", "redis://127.0.0.1:1/0"}, &syncBuffer{})
	if err == nil || !strings.Contains(err.Error(), "envoy.failover") || !strings.Contains(err.Error(), "store.redis.hmac_key_file") {
		t.Fatalf("start-up: %v", err)
	}
}
