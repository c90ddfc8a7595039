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
// calls at once (Redis 10 ms away) it keeps IdleConns. Before, go-redis kept every connection a
// burst opened, up to pool_size (10 a core), for 30 minutes: a fleet held
// that many per replica against Redis's maxclients, and a replica's memory
// grew 64 KiB a connection with its worst burst (the fleet soak's live
// heap, 13.9 → 15.9 MiB). A URL that sets max_idle_conns keeps its own.
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
		if st := c.PoolStats(); int(st.IdleConns) != tc.idle || int(st.TotalConns) != tc.idle {
			t.Errorf("%q: after the burst %d connections, %d idle; want %d", tc.query, st.TotalConns, st.IdleConns, tc.idle)
		}
		_ = c.Close()
	}
}
