package mainlib

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestOverlayCacheSurvivesAFleetRestart (R-ST15) end to end: with
// store.redis.overlay_cache set, an acknowledged change is in the cache
// file; after Redis is emptied and the replica restarted, the restarted
// one runs with the change and has put it back into Redis, so a replica
// without the file runs with it too.
func TestOverlayCacheSurvivesAFleetRestart(t *testing.T) {
	srv := redistest.Start(t)
	cache := filepath.Join(t.TempDir(), "cache", "overlays.json")
	logs := &syncBuffer{}
	ready := func(in *Instance) {
		waitFor(t, "replica ready", func() bool {
			code, body := get(t, "http://"+in.AdminAddr()+"/readyz", "")
			return code == 200 && strings.Contains(body, `"store":{"ready":true`)
		})
	}
	a := startOnRedisWith(t, srv.Addr, logs, `overlay_cache: "`+cache+`"`)
	ready(a)
	if code, body := send(t, "PATCH", "http://"+a.AdminAddr()+"/admin/v1/gateways/default", `{"circuit_breaker": {"enabled": true, "failure_threshold": 7}}`); code != 200 {
		t.Fatalf("patch: %d %s", code, body)
	}
	if b, err := os.ReadFile(cache); err != nil || !strings.Contains(string(b), "revisions") {
		t.Fatalf("the cache file after the change: %v %q", err, b)
	}
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	restarted := startOnRedisWith(t, srv.Addr, logs, `overlay_cache: "`+cache+`"`)
	ready(restarted)
	for name, in := range map[string]*Instance{"the restarted replica": restarted, "a replica with no cache": startOnRedis(t, srv.Addr, logs)} {
		ready(in)
		waitFor(t, name+" runs with the change", func() bool {
			_, body := get(t, "http://"+in.AdminAddr()+"/admin/v1/gateways/default", "")
			return strings.Contains(body, `"failure_threshold":7`)
		})
	}
}
