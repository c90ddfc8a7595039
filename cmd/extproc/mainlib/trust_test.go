package mainlib

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// TestSignedFleetIgnoresForgedOverlay (R-L12): with store.redis.hmac_key_file
// set, admin changes still reach every replica, and an overlay written
// straight into Redis (the probe's: breaker disabled) with a notice on the
// feed changes nothing on any replica, even when a real change makes them
// read the overlays again; it is counted. Without a key, the same document
// was put in force on every replica with no [admin] line.
func TestSignedFleetIgnoresForgedOverlay(t *testing.T) {
	srv := redistest.Start(t)
	keyFile := filepath.Join(t.TempDir(), "fleet.key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	in := []*Instance{
		startOnRedisWith(t, srv.Addr, logs, `hmac_key_file: "`+keyFile+`"`),
		startOnRedisWith(t, srv.Addr, logs, `hmac_key_file: "`+keyFile+`"`),
	}
	gw := func(i int, id string) string { return "http://" + in[i].AdminAddr() + "/admin/v1/gateways/" + id }
	for i := range in {
		waitFor(t, "replica ready", func() bool {
			code, body := get(t, "http://"+in[i].AdminAddr()+"/readyz", "")
			return code == 200 && strings.Contains(body, `"store":{"ready":true`)
		})
	}
	if code, body := send(t, "PATCH", gw(0, "default"), `{"circuit_breaker": {"enabled": true, "failure_threshold": 2}}`); code != 200 {
		t.Fatalf("patch: %d %s", code, body)
	}
	waitFor(t, "the signed change reaches replica 1", func() bool {
		_, body := get(t, gw(1, "default"), "")
		return strings.Contains(body, `"failure_threshold":2`)
	})

	// The forgery: a document that turns the breaker off, and a notice.
	client := srv.Client(t)
	ctx := context.Background()
	forged := `{"doc":{"id":"default","circuit_breaker":{"enabled":false},"models":[{"name":"gpt-4o-mini","routes":["x:y:z"]}],"routes":[{"key":"x:y:z","cluster":"attacker"}]},"updated_at":"2026-12-01T00:00:00Z"}`
	if err := client.HSet(ctx, "fx:overlays", "default", forged).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Publish(ctx, "fx:feed", "\x08\x01\x12\x04evil\x22\x09\x0a\x07default").Err(); err != nil {
		t.Fatal(err)
	}
	// A real change elsewhere makes replica 1 read every overlay again.
	put := `{"models":[{"name":"m","routes":["a:r:m","b:r:m"]}],"routes":[{"key":"a:r:m","cluster":"ca"},{"key":"b:r:m","cluster":"cb"}]}`
	if code, body := send(t, "PUT", gw(0, "g2"), put); code != 201 {
		t.Fatalf("put: %d %s", code, body)
	}
	waitFor(t, "replica 1 reads the overlays again", func() bool { code, _ := get(t, gw(1, "g2"), ""); return code == 200 })
	for i := range in {
		_, body := get(t, gw(i, "default"), "")
		if !strings.Contains(body, `"failure_threshold":2`) || strings.Contains(body, "attacker") {
			t.Fatalf("replica %d took the forged overlay: %s", i, body)
		}
	}
	waitFor(t, "the forgeries counted", func() bool {
		_, m := get(t, "http://"+in[1].AdminAddr()+"/metrics", "")
		return strings.Contains(m, `fusebox_refused_total{what="overlay_unsigned"} 1`) && !strings.Contains(m, `fusebox_refused_total{what="feed_unsigned"} 0`)
	})
}
