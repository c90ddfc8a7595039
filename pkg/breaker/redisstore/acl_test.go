package redisstore_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// TestACLUserFromTheFleetPage: the ACL user docs/fleet.md shows ("Redis is
// trusted storage"), read from the page, is enough for everything the
// store does (scripts, feed, overlays), and keeps fusebox out of every
// other key.
func TestACLUserFromTheFleetPage(t *testing.T) {
	page, err := os.ReadFile("../../../docs/fleet.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rule, ok := strings.Cut(string(page), "\n  user fusebox ")
	rule, _, _ = strings.Cut(rule, "\n")
	if !ok || !strings.Contains(rule, "~fusebox:*") {
		t.Fatalf("docs/fleet.md shows no ACL user for fusebox")
	}
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", "fusebox"}, toAny(strings.Fields(rule))...)...).Err(); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "fusebox", Password: "LONG-RANDOM-PASSWORD"})
	t.Cleanup(func() { client.Close() })
	clk := breaker.NewFakeClock(time.Now())
	var errs []string
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "fusebox:", OpTimeout: time.Second, Clock: clk,
		OnError: func(op string) { errs = append(errs, op) }})
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 })
	keys, _, err := st.Install(ctx, clk.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	wg := st.Start(runCtx)
	defer func() { cancel(); wg.Wait() }()
	eventually(t, "ready", st.Ready)
	adm, _, _ := st.Acquire(ctx, keys[0], clk.Now().UnixNano(), false)
	if _, err := st.Record(ctx, keys[0], clk.Now().UnixNano(), adm, fail503); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Status(ctx, keys[0], clk.Now().UnixNano()); err != nil || s.State != "open" {
		t.Fatalf("status %+v %v", s, err)
	}
	ov := &redisstore.Overlays{Store: st}
	if err := ov.Save(ctx, "default", []byte(`{"doc":{"id":"default"}}`)); err != nil {
		t.Fatal(err)
	}
	if got, err := ov.Load(ctx); err != nil || len(got) != 1 {
		t.Fatalf("overlays %v %v", got, err)
	}
	if st.Degraded() || len(errs) > 0 {
		t.Fatalf("degraded %v, errors %v", st.Degraded(), errs)
	}
	if err := client.Set(ctx, "other:key", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("the fusebox user wrote outside its prefix: %v", err)
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
