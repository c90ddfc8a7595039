package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
)

// R-DL7: when the meeting place cannot be reached, a note's
// compare-and-set reports that, never a success on the replica's own
// table. Two replicas through one stalled, then cut, proxy: neither claims
// the note, so neither records the decision twice. Before, each replica
// swapped on its own table and both reported ok. The notes are signed with
// the fleet key (the signed path, which no test ran before), and a note
// another writer put there unsigned is refused.
func TestNoteSwapReportsAnUnreachableRedis(t *testing.T) {
	srv := redistest.Start(t)
	px := srv.Proxy(t)
	waits := &decisionWaits{opTimeout: 50 * time.Millisecond}
	open := func() *redisstore.Store {
		client, err := redisstore.NewClient("redis://" + px.Addr + "/0")
		if err != nil {
			t.Fatal(err)
		}
		client.AddHook(waits)
		t.Cleanup(func() { client.Close() })
		return redisstore.New(redisstore.Options{TestClock: true, Client: client, KeyPrefix: "notes:", OpTimeout: 50 * time.Millisecond,
			Clock: breaker.NewFakeClock(time.Now()), HMACKey: []byte("the fleet key")})
	}
	a, b := open(), open()
	ctx := context.Background()
	// The healthy calls are retried while Redis does not answer within the
	// 50 ms op timeout: a cold connection through the proxy missed it in
	// CI's race step on a loaded machine (#54: a healthy call's time is
	// the machine's). A first call that timed out may have written the
	// note: its value read back is a success too.
	const note = `{"p":{"n":0}}`
	healthy := func(st *redisstore.Store, next string) ([]byte, bool) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			cur, ok, err := st.SwapNote(ctx, "a:d1", nil, []byte(next), time.Minute)
			if err == nil {
				return cur, ok
			}
			if time.Now().After(deadline) {
				t.Fatalf("a healthy swap: %v", err)
			}
		}
	}
	if cur, ok := healthy(a, note); !ok && string(cur) != note {
		t.Fatalf("a healthy swap: %v, read %q", ok, cur)
	}
	// The signed note reads back through the other replica.
	if cur, ok := healthy(b, "x"); ok || string(cur) != note {
		t.Fatalf("b read %q %v", cur, ok)
	}
	for _, fault := range []struct {
		name string
		on   func(bool)
	}{{"stalled", px.Stall}, {"blackholed", px.Blackhole}} {
		t.Run(fault.name, func(t *testing.T) {
			fault.on(true)
			defer fault.on(false)
			for _, st := range []*redisstore.Store{a, b} {
				// Bounded by the deadline its commands ran under (one, of
				// the op timeout), not the wall clock: a 500 ms bound was a
				// loaded machine's to break.
				t0 := time.Now()
				dctx, dw := waits.decision(ctx)
				_, ok, err := st.SwapNote(dctx, "a:d2", nil, []byte("claim"), time.Minute)
				el := time.Since(t0)
				waits.done(dw)
				if ok || !errors.Is(err, redisstore.ErrNoteUnreachable) {
					t.Fatalf("a swap through a %s Redis: ok %v, err %v (want ErrNoteUnreachable)", fault.name, ok, err)
				}
				waits.check(t, el)
			}
		})
	}
	// Back: the note is free, or holds what a swap reported unreachable
	// wrote after all (Redis ran it; its answer was lost): neither replica
	// was told it claimed it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cur, ok, err := a.SwapNote(ctx, "a:d2", nil, []byte("claim"), time.Minute)
		if ok && err == nil || err == nil && string(cur) == "claim" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the note is not free 30 s after Redis came back: %v %v %q", ok, err, cur)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A note written without the fleet's signature is refused.
	if err := srv.Client(t).Set(ctx, "notes:note:a:d3", `{"o":true}`, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := a.SwapNote(ctx, "a:d3", nil, []byte("claim"), time.Minute); ok || err == nil {
		t.Fatalf("an unsigned note: ok %v err %v", ok, err)
	}
}
