package mainlib

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// startOnRedis starts fusebox with store.backend redis, the URL given by
// -redis-url (which overrides the file and FUSEBOX_REDIS_URL).
func startOnRedis(t *testing.T, addr string, logs *syncBuffer) *Instance {
	t.Helper()
	return startOnRedisWith(t, addr, logs, "")
}

// startOnRedisWith is startOnRedis with more store.redis fields (YAML flow
// entries, e.g. `hmac_key_file: "/k"`).
func startOnRedisWith(t *testing.T, addr string, logs *syncBuffer, redisFields string) *Instance {
	t.Helper()
	if redisFields != "" {
		redisFields = ", " + redisFields
	}
	edit := func(doc string) string {
		return strings.Replace(doc, "backend: memory\n", "backend: redis\n  redis: {url: \"redis://127.0.0.1:1/0\", key_prefix: \"fx:\""+redisFields+"}\n", 1)
	}
	good, err := os.ReadFile("../../../pkg/routes/default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fusebox.yaml")
	if err := os.WriteFile(path, []byte(edit(string(good))), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in, err := Start(ctx, []string{"-config", path, "-grpc-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0",
		"-grace-period", "0s", "-redis-url", "redis://" + addr + "/0"}, logs, WithOverlayCache(""))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = in.Wait() })
	return in
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Three fusebox processes' worth of wiring on one Redis: readiness follows
// the first snapshot, a PATCH on one replica applies on the others at once,
// a route opened by failures through one replica's ext_proc stream is
// skipped by the others' decisions, and Redis going away leaves every
// replica ready but degraded.
func TestReplicasOnOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	logs := &syncBuffer{}
	var in []*Instance
	for i := 0; i < 3; i++ {
		in = append(in, startOnRedis(t, srv.Addr, logs))
	}
	for _, r := range in {
		waitFor(t, "replica ready", func() bool {
			code, body := get(t, "http://"+r.AdminAddr()+"/readyz", "")
			return code == 200 && strings.Contains(body, `"store":{"ready":true`)
		})
	}
	// A PATCH on replica 0 reaches replicas 1 and 2.
	base := func(i int) string { return "http://" + in[i].AdminAddr() + "/admin/v1/gateways/default" }
	if code, body := send(t, "PATCH", base(0), `{"circuit_breaker": {"enabled": true, "failure_threshold": 2}}`); code != 200 {
		t.Fatalf("patch: %d %s", code, body)
	}
	for _, i := range []int{1, 2} {
		waitFor(t, "the PATCH on replica 0 applies on the others", func() bool {
			_, body := get(t, base(i), "")
			return strings.Contains(body, `"failure_threshold":2`) && strings.Contains(body, `"source":"admin"`)
		})
	}
	// Two failures through replica 1 open the route for replica 2.
	c1, err := grpc.NewClient(in[1].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	route := roundTrip500(t, c1)
	if again := roundTrip500(t, c1); again != route {
		t.Fatalf("the second request went to %s, not %s", again, route)
	}
	c2, err := grpc.NewClient(in[2].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	waitFor(t, "replica 2 routes around the route replica 1 opened", func() bool {
		_, body := get(t, base(2)+"/circuit-breaker", "")
		return strings.Contains(body, `"`+route+`":{"state":"open"`)
	})
	if next := roundTrip500(t, c2); next == route {
		t.Fatalf("replica 2 still sent a request to %s, open since replica 1's failures", route)
	}
	// The transition was logged once, by the replica whose script made it.
	// Replica 2 reads the state from Redis itself, so it can see the route
	// open before replica 1's record worker has taken the script's answer
	// and logged it (both cores busy: 0 lines when replica 2 saw it).
	waitFor(t, "the transition logged", func() bool {
		return strings.Contains(logs.String(), "[circuit_breaker] closed->open")
	})
	if n := strings.Count(logs.String(), "[circuit_breaker] closed->open"); n != 1 {
		t.Fatalf("closed->open logged %d times across three replicas, want once:\n%s", n, logs.String())
	}
	// Replica 2's timeline has the transition replica 1 made (#37: before,
	// "recent transitions" were each replica's own, empty behind a Service
	// on every replica but the one whose script opened the route).
	waitFor(t, "replica 2's timeline shows replica 1's transition", func() bool {
		return fleetTimelineHas(in[2], route, "closed->open")
	})
	// Redis gone: still ready, reported degraded, decisions go on.
	srv.Stop()
	roundTrip500(t, c2)
	waitFor(t, "degraded in /readyz", func() bool {
		code, body := get(t, "http://"+in[2].AdminAddr()+"/readyz", "")
		return code == 200 && strings.Contains(body, `"degraded":true`)
	})
	if !strings.Contains(logs.String(), "Redis is unreachable") {
		t.Fatal("the outage was not logged")
	}
}

// fleetTimelineHas reports whether r's transitions API answers from the
// fleet's journal and holds route's transition, made by a named replica.
func fleetTimelineHas(r *Instance, route, transition string) bool {
	resp, err := http.Get("http://" + r.AdminAddr() + "/admin/v1/transitions")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var entries []breaker.JournalEntry
	if json.NewDecoder(resp.Body).Decode(&entries) != nil || resp.Header.Get("X-Fusebox-Journal") != "fleet" {
		return false
	}
	for _, e := range entries {
		if e.Route == route && e.Transition == transition && e.Replica != "" {
			return true
		}
	}
	return false
}
