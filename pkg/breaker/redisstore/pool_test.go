package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/redis/go-redis/v9"
)

// A replica's idle connections do not follow its worst burst: after 30
// calls at once (Redis 10 ms away) and the steady use a replica goes on
// with, it keeps IdleConns. Before, go-redis kept every connection a burst
// opened, up to pool_size (10 a core), for 30 minutes: a fleet held that
// many per replica against Redis's maxclients, and a replica's memory grew
// 64 KiB a connection with its worst burst (the fleet soak's live heap,
// 13.9 → 15.9 MiB). A URL that sets max_idle_conns keeps its own.
//
// Right after the burst the pool may hold a few more: go-redis (v9.23,
// internal/pool ConnPool.queuedNewConn and putIdleConn) dials for a
// waiting call in the background, and when a returned connection served
// that call first, the late dial joins the idle list without the bound's
// check. The next calls trim it, one each, as they come back (putConn
// checks the bound). On a loaded machine this test saw 9 idle, not 8,
// when it measured right after the burst.
func TestIdleConnectionsAreBounded(t *testing.T) {
	srv := redistest.Start(t)
	cases := []struct {
		query string
		idle  int
	}{
		{"", redisstore.IdleConns},
		{"?max_idle_conns=2", 2},
	}
	for _, tc := range cases {
		px := srv.Proxy(t)
		client, err := redisstore.NewClient("redis://" + px.Addr + "/0" + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		c := client.(*redis.Client)
		px.Latency(10*time.Millisecond, 10*time.Millisecond)
		burst := func(n int) {
			var calls sync.WaitGroup
			for i := 0; i < n; i++ {
				calls.Add(1)
				go func() {
					defer calls.Done()
					if err := c.Ping(context.Background()).Err(); err != nil {
						t.Error(err)
					}
				}()
			}
			calls.Wait()
		}
		burst(30)
		st := c.PoolStats()
		after := st.TotalConns
		// The steady use after it: one call at a time, as many as the
		// burst could have left beyond the bound.
		for i := 0; i < 30; i++ {
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if st = c.PoolStats(); int(st.IdleConns) != tc.idle || int(st.TotalConns) != tc.idle {
			t.Errorf("%q: after the burst (%d connections) and 30 calls, %d connections, %d idle; want %d", tc.query, after, st.TotalConns, st.IdleConns, tc.idle)
		}
		_ = c.Close()
	}
}
