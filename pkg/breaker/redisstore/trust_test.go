package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	replicav1 "github.com/fusebox-llm/fusebox/proto/replica/v1"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
)

// forgedOpen is what the probe published: a transition of replicaID to
// forced open with sequence 2^63, from a replica that does not exist.
func forgedOpen(t *testing.T) []byte {
	t.Helper()
	env := &replicav1.Envelope{SchemaVersion: replicav1.SchemaVersion_SCHEMA_VERSION_1, Origin: "evil",
		Body: &replicav1.Envelope_Transition{Transition: &replicav1.Transition{
			Breaker:  &replicav1.BreakerId{Gateway: replicaID.Gateway, Route: replicaID.Route, Scope: replicav1.Scope_SCOPE_GATEWAY},
			Snapshot: &replicav1.Snapshot{Seq: 1 << 63, State: replicav1.State_STATE_OPEN, Generation: 99, Reason: "forced", Forced: true},
			From:     replicav1.State_STATE_CLOSED, To: replicav1.State_STATE_OPEN, Reason: "forced",
		}}}
	b, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// subscribed waits until n replicas listen on the feed channel: a message
// published before would prove nothing.
func subscribed(t *testing.T, client *redis.Client, channel string, n int64) {
	t.Helper()
	eventually(t, "replicas subscribed to "+channel, func() bool {
		m, err := client.PubSubNumSub(context.Background(), channel).Result()
		return err == nil && m[channel] >= n
	})
}

// TestForgedFeedMessageMovesNoView (R-L12): a feed message is a hint to
// read Redis, never a state. Before, the forged message pinned a healthy
// route open on every replica, and no refresh could repair it (its
// sequence was above anything Redis would ever hold).
func TestForgedFeedMessageMovesNoView(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, client, "forge:", clk, replicaPolicy(nil), 2, time.Second)
	ctx := context.Background()
	subscribed(t, client, "forge:feed", 2)
	if err := client.Publish(ctx, "forge:feed", forgedOpen(t)).Err(); err != nil {
		t.Fatal(err)
	}
	// Past two refresh periods: whatever the message did, it did.
	time.Sleep(500 * time.Millisecond)
	for i, r := range rs {
		if !r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed {
			t.Fatalf("replica %d: the forged message closed a healthy route", i)
		}
	}
	// Real failures still open it on both.
	for i := 0; i < 6; i++ {
		r := rs[i%2]
		adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
		if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, fail503); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range rs {
		eventually(t, "replica sees the real open", func() bool { return !r.st.Peek(ctx, r.key, clk.Now().UnixNano()).Allowed })
		_ = i
	}
}

// TestSignedFeedAndOverlays (R-L12): with a fleet key, replicas still
// share transitions and admin changes, and an unsigned or wrongly signed
// feed message or overlay document changes nothing, and is counted.
func TestSignedFeedAndOverlays(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	key := []byte(strings.Repeat("k", 32))
	var mu sync.Mutex
	refused := map[string]int{}
	rs := replicasWith(t, client, "sig:", clk, replicaPolicy(nil), 2, time.Second, func(_ int, o *redisstore.Options) {
		o.HMACKey = key
		o.OnRefused = func(w string) { mu.Lock(); refused[w]++; mu.Unlock() }
	})
	ctx := context.Background()
	count := func(w string) int { mu.Lock(); defer mu.Unlock(); return refused[w] }

	// A forged message, unsigned, and one signed with another key.
	subscribed(t, client, "sig:feed", 2)
	if err := client.Publish(ctx, "sig:feed", forgedOpen(t)).Err(); err != nil {
		t.Fatal(err)
	}
	other := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "sig:", HMACKey: []byte(strings.Repeat("x", 32))})
	if err := other.PublishOverlay(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both forged messages dropped by both replicas", func() bool { return count("feed_unsigned") == 4 })

	// Signed transitions still reach the other replica.
	for i := 0; i < 6; i++ {
		adm, _, _ := rs[0].st.Acquire(ctx, rs[0].key, clk.Now().UnixNano(), false)
		_, _ = rs[0].st.Record(ctx, rs[0].key, clk.Now().UnixNano(), adm, fail503)
	}
	eventually(t, "replica 1 sees the open", func() bool { return !rs[1].st.Peek(ctx, rs[1].key, clk.Now().UnixNano()).Allowed })

	// Overlays: a signed document reads back on the other replica; a
	// document written straight into the hash, or a signed one moved to
	// another gateway, is refused and named.
	o0, o1 := &redisstore.Overlays{Store: rs[0].st}, &redisstore.Overlays{Store: rs[1].st}
	doc := []byte(`{"doc":{"id":"default"},"updated_at":"2026-12-01T00:00:00Z"}`)
	if err := o0.Save(ctx, "default", doc); err != nil {
		t.Fatal(err)
	}
	signed, _ := client.HGet(ctx, "sig:overlays", "default").Result()
	if err := client.HSet(ctx, "sig:overlays", "forged", `{"doc":{"id":"forged","circuit_breaker":{"enabled":false}}}`, "moved", signed).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := o1.Load(ctx)
	var bad *routes.BadOverlaysError
	if !errors.As(err, &bad) || strings.Join(bad.IDs, ",") != "forged,moved" {
		t.Fatalf("Load: err %v", err)
	}
	if string(got["default"]) != string(doc) || len(got) != 1 {
		t.Fatalf("Load: %q", got)
	}
	if count("overlay_unsigned") != 2 {
		t.Fatalf("overlay_unsigned counted %d", count("overlay_unsigned"))
	}
}

// TestUnreadableStateIsThatBreakersProblem (R-L12): a value in a breaker's
// state key that is not fusebox's (garbage, another type) is rewritten as
// a closed breaker; the store is never degraded. Before, one garbage value
// made every replica degraded, "Redis is unreachable" every refresh.
func TestUnreadableStateIsThatBreakersProblem(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	rs := replicas(t, client, "bad:", clk, replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 2 }), 1, time.Second)
	r := rs[0]
	ctx := context.Background()
	stateKey := r.st.Key(replicaID)
	for _, corrupt := range []func() error{
		func() error { return client.Set(ctx, stateKey, "\xc1garbage\x00", 0).Err() },
		func() error { return client.Set(ctx, stateKey, "\x93\x01\x02\x03", 0).Err() }, // msgpack, not a table of ours
		func() error { return client.Set(ctx, stateKey, "\x81\xa2st\xa1x", 0).Err() },  // {st: "x"}
		func() error { // another type under the key, in one step (a refresh may write it between two)
			_, err := client.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, stateKey)
				p.HSet(ctx, stateKey, "f", "v")
				return nil
			})
			return err
		},
	} {
		if err := corrupt(); err != nil {
			t.Fatal(err)
		}
		// The next call rewrites the state (this one, or a refresh that
		// came first); the view takes the fresh state and its generation.
		if _, err := r.st.Status(ctx, r.key, clk.Now().UnixNano()); err != nil {
			t.Fatalf("a bad key made a call fail: %v", err)
		}
		for i := 0; i < 2; i++ {
			adm, _, err := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, fail503); err != nil {
				t.Fatal(err)
			}
		}
		// In Redis, not only on the local view (own evidence opens that at
		// once): the records are queued.
		eventuallyOpen(t, "the breaker opens on the rewritten state", r, clk)
		if r.st.Degraded() {
			t.Fatal("one bad key turned the store degraded")
		}
		if err := r.st.Reset(ctx, r.key, clk.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every rewrite counted", func() bool { return r.errCount("key_rewritten") >= 4 })
}

// redisErr is an error reply as go-redis reports one.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

var _ redis.Error = redisErr("")

// keyErrorStore starts a store on client with specs installed, and a hook
// that makes replicaID's key answer an error reply while it is on.
func keyErrorStore(t *testing.T, client *redis.Client, prefix string, clk breaker.Clock, specs []breaker.Spec) (*redisstore.Store, []breaker.Key, *failKey) {
	t.Helper()
	ctx := context.Background()
	st := redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: prefix, OpTimeout: time.Second, Clock: clk,
		RefreshInterval: 100 * time.Millisecond})
	keys, _, err := st.Install(ctx, clk.Now().UnixNano(), specs)
	if err != nil {
		t.Fatal(err)
	}
	hook := &failKey{key: st.Key(replicaID)}
	client.AddHook(hook)
	runCtx, cancel := context.WithCancel(ctx)
	wg := st.Start(runCtx)
	t.Cleanup(func() { cancel(); wg.Wait() })
	eventually(t, "ready", st.Ready)
	return st, keys, hook
}

// failKey makes every script call on one key answer an error reply.
type failKey struct {
	key string
	on  atomic.Bool
}

func (f *failKey) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *failKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if f.on.Load() && len(args) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && args[3] == f.key {
			err := redisErr("ERR user_script:1: Script attempted to access nonexistent global variable 'x'")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestKeyErrorDegradesOnlyThatBreaker (R-L12): Redis answering one
// breaker's calls with an error reply puts that breaker on local state
// alone: it still decides and opens on its own evidence, the other
// breakers keep using Redis, the store is not degraded, and when the key
// reads again the breaker returns to Redis.
func TestKeyErrorDegradesOnlyThatBreaker(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	clk := breaker.NewFakeClock(time.Now())
	ctx := context.Background()
	good := breaker.RouteID("gw", "azure:eu:m")
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 2 })
	st, keys, hook := keyErrorStore(t, client, "kerr:", clk, []breaker.Spec{{ID: replicaID, Policy: p}, {ID: good, Policy: p}})
	hook.on.Store(true)
	fail := func(k breaker.Key) {
		adm, _, _ := st.Acquire(ctx, k, clk.Now().UnixNano(), false)
		_, _ = st.Record(ctx, k, clk.Now().UnixNano(), adm, fail503)
	}
	fail(keys[0])
	fail(keys[0])
	if st.Peek(ctx, keys[0], clk.Now().UnixNano()).Allowed {
		t.Fatal("the breaker whose key fails did not open on its own evidence")
	}
	if st.Degraded() {
		t.Fatal("one key's error turned the whole store degraded")
	}
	// The other breaker still records in Redis.
	fail(keys[1])
	if n, _ := st.Status(ctx, keys[1], clk.Now().UnixNano()); n.Failures != 1 {
		t.Fatalf("the healthy key's failures in Redis: %d", n.Failures)
	}
	// The key reads again: its local open is written back to Redis.
	hook.on.Store(false)
	eventually(t, "the local open reaches Redis", func() bool {
		v, err := client.Exists(ctx, st.Key(replicaID)).Result()
		if err != nil || v == 0 {
			return false
		}
		s, err := st.Status(ctx, keys[0], clk.Now().UnixNano())
		return err == nil && s.State == "open"
	})
}
