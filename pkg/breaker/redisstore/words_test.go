package redisstore_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// wordsStore is one synchronous store on a fresh Redis, its breaker
// installed with threshold 1.
func wordsStore(t *testing.T, o redisstore.Options) (*redisstore.Store, breaker.Key, func() map[string]any, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	client := srv.Client(t)
	o.Client, o.KeyPrefix, o.OpTimeout = client, "words:", 2*time.Second
	st := redisstore.New(o)
	p := replicaPolicy(func(p *breaker.Policy) { p.FailureThreshold = 1 })
	keys, _, err := st.Install(context.Background(), time.Now().UnixNano(), []breaker.Spec{{ID: replicaID, Policy: p}})
	if err != nil {
		t.Fatal(err)
	}
	raw := func() map[string]any {
		s, err := client.Eval(context.Background(), "return cjson.encode(cmsgpack.unpack(redis.call('GET', KEYS[1])))",
			[]string{st.Key(replicaID)}).Text()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	return st, keys[0], raw, client
}

// TestStateFieldsHaveWords (R-ST16): the state in Redis names its fields
// in words (schema 2). Before: st oa ra rc ou fo fu bu cons tc te fw rw ls
// nl sb v inc lc ca.
func TestStateFieldsHaveWords(t *testing.T) {
	clk := breaker.NewFakeClock(time.Now())
	st, k, raw, _ := wordsStore(t, redisstore.Options{TestClock: true, Clock: clk})
	ctx := context.Background()
	if _, err := st.Record(ctx, k, clk.Now().UnixNano(), breaker.Admission{Gen: 1}, fail503); err != nil {
		t.Fatal(err)
	}
	m := raw()
	for _, old := range []string{"sv", "st", "oa", "ra", "rc", "ou", "fo", "fu", "bu", "cons", "tc", "te", "fw", "rw", "ls", "nl", "sb", "v", "inc", "lc", "ca"} {
		if _, ok := m[old]; ok {
			t.Errorf("the state still has %q", old)
		}
	}
	for _, f := range []string{"schema", "state", "generation", "opened_at", "open_until", "reason", "leases", "incarnation", "seq"} {
		if _, ok := m[f]; !ok {
			t.Errorf("the state has no %q: %v", f, m)
		}
	}
	if m["schema"] != 2.0 || m["state"] != 1.0 {
		t.Fatalf("schema %v state %v", m["schema"], m["state"])
	}
}

// TestSchemaOneStateIsRead: a state an earlier fusebox wrote (schema 1,
// two-letter names) is read, not rewritten as a fresh closed breaker: an
// open breaker stays open across the upgrade, and runs its cooldown.
func TestSchemaOneStateIsRead(t *testing.T) {
	clk := breaker.NewFakeClock(time.Now())
	st, k, raw, client := wordsStore(t, redisstore.Options{TestClock: true, Clock: clk})
	ctx := context.Background()
	nowMs := clk.Now().UnixMilli()
	_, err := client.Eval(ctx, `redis.call('SET', KEYS[1], cmsgpack.pack({sv = 1, st = 1, gen = 5, reason = 'timeout',
		oa = tonumber(ARGV[1]), ra = 0, rc = 0, ou = tonumber(ARGV[1]) + 10000, fo = 0, fu = 0, bu = 0, cons = 0, tc = 0, te = 0,
		fw = {}, rw = {}, ls = {}, nl = 0, sb = '', v = 3, inc = '1.1', lc = 0, ca = 0})) return 1`,
		[]string{st.Key(replicaID)}, nowMs).Result()
	if err != nil {
		t.Fatal(err)
	}
	s, err := st.Status(ctx, k, clk.Now().UnixNano())
	if err != nil || s.State != "open" || s.Reason != "timeout" {
		t.Fatalf("the schema-1 open breaker reads %+v, %v", s, err)
	}
	if m := raw(); m["schema"] != 2.0 || m["generation"] != 5.0 {
		t.Fatalf("not upgraded in place: %v", m)
	}
	clk.Advance(10 * time.Second)
	if s, _ := st.Status(ctx, k, clk.Now().UnixNano()); s.State != "half_open" {
		t.Fatalf("after its cooldown: %+v", s)
	}
}

// TestTimeIsRedisTime (R-ST16): without a test clock the scripts' now is
// Redis's TIME, whatever the replica's clock says — even 300 ms off, which
// the old half-second dead band let stand (an open recorded at the
// replica's time, so two replicas 400 ms apart ran one cooldown on two
// clocks).
func TestTimeIsRedisTime(t *testing.T) {
	st, k, _, _ := wordsStore(t, redisstore.Options{Clock: aheadClock{300 * time.Millisecond}})
	ctx := context.Background()
	before := time.Now()
	if _, err := st.Record(ctx, k, aheadClock{300 * time.Millisecond}.Now().UnixNano(), breaker.Admission{Gen: 1}, fail503); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	s, err := st.Status(ctx, k, aheadClock{300 * time.Millisecond}.Now().UnixNano())
	if err != nil || s.OpenedAt == nil {
		t.Fatalf("%+v %v", s, err)
	}
	opened := time.UnixMilli(int64(math.Round(*s.OpenedAt * 1000)))
	if opened.Before(before.Add(-20*time.Millisecond)) || opened.After(after.Add(20*time.Millisecond)) {
		t.Fatalf("opened at %v, the call ran %v..%v (Redis's clock); the replica's clock said %v",
			opened.Format(time.StampMilli), before.Format(time.StampMilli), after.Format(time.StampMilli),
			before.Add(300*time.Millisecond).Format(time.StampMilli))
	}
}
