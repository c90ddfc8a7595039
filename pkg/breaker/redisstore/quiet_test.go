package redisstore_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// keyErr is an error reply about one key (keyerror.go): the breaker goes
// on the local view alone, the store is not degraded.
type keyErr string

func (e keyErr) Error() string { return string(e) }
func (keyErr) RedisError()     {}

// holdRecords answers the first breaker record with a key error and holds
// the second (the write-back of the first) until release is closed.
type holdRecords struct {
	n       atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func (h *holdRecords) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdRecords) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !breakerCall(cmd) || !isRecord(cmd) {
			return next(ctx, cmd)
		}
		switch h.n.Add(1) {
		case 1:
			cmd.SetErr(keyErr("ERR failpoint: this key's script failed"))
			return cmd.Err()
		case 2:
			close(h.held)
			<-h.release
		}
		return next(ctx, cmd)
	}
}
func (h *holdRecords) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isRecord: the call's arguments name the op "rec" (MessagePack keeps the
// string as it is).
func isRecord(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		var b []byte
		switch v := a.(type) {
		case string:
			b = []byte(v)
		case []byte:
			b = v
		}
		if bytes.Contains(b, []byte("\xd9\x02op\xd9\x03rec")) {
			return true
		}
	}
	return false
}

// The checker reads Redis once every replica is quiet. A record Redis did
// not take goes back from the refresh while the store is not degraded
// (writeBackBroken); while that call is on its way the replica is not
// quiet. Before, the write-back took the unsent list before its call, so
// Quiet said yes with a record still to land: the robustness checker read
// the window (167 calls) before the record's key (168 keys) in CI.
func TestQuietWhileAWriteBackIsOnItsWay(t *testing.T) {
	srv := redistest.Start(t)
	client, err := redisstore.NewClient("redis://" + srv.Addr + "/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	h := &holdRecords{held: make(chan struct{}), release: make(chan struct{})}
	client.AddHook(h)
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
	}()
	clk := breaker.NewFakeClock(time.Now())
	r := replicasWith(t, client, "quiet:", clk, replicaPolicy(nil), 1, time.Second, func(_ int, o *redisstore.Options) {
		o.RefreshInterval = 20 * time.Millisecond
	})[0]
	ctx := context.Background()
	adm, _, _ := r.st.Acquire(ctx, r.key, clk.Now().UnixNano(), false)
	res := fail503
	res.Key = "d1:1"
	if _, err := r.st.Record(ctx, r.key, clk.Now().UnixNano(), adm, res); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the record Redis refused was not written back")
	}
	for range 20 {
		if r.st.Quiet() {
			t.Fatal("quiet while the write-back of a record is on its way to Redis")
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(h.release)
	released = true
	quietly(t, "replica quiet", r.st.Quiet)
	s, err := r.st.Status(ctx, r.key, clk.Now().UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	if s.WindowCalls != 1 || s.WindowFailures != 1 {
		t.Fatalf("Redis counts %d calls (%d failures), want the one record", s.WindowCalls, s.WindowFailures)
	}
}
