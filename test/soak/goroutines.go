package main

import (
	"bytes"
	"runtime/pprof"
	"strings"
)

// harnessFrames mark a goroutine as the test world's, not fusebox's:
// envoysim, the fake providers and the soak itself (test/...), the Redis
// fault proxy and servers (redistest), and the clients that play Envoy and
// the callers (fusebox is never a gRPC or HTTP client). The Redis proxy
// alone keeps two goroutines per connection go-redis holds, a number the
// pool sizes by load (up to PoolSize per replica), not a leak.
var harnessFrames = []string{
	"fusebox/test/",
	"redisstore/redistest.",
	"grpc/internal/transport.(*http2Client)",
	"grpc.newClientStream",
	"grpc.(*clientStream)",
	"grpc.(*addrConn)",
	"grpc.(*ClientConn)",
	"grpc.(*ccBalancerWrapper)",
	"grpc.(*ccResolverWrapper)",
	"grpc/internal/grpcsync.(*CallbackSerializer)",
	"net/http.(*persistConn)",
	"net/http.(*Transport)",
}

// goroutineCounts returns all goroutines and fusebox's own (the harness's
// left out), from one dump of every stack.
func goroutineCounts() (all, fusebox int) {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return countGoroutines(b.String())
}

func countGoroutines(dump string) (all, fusebox int) {
	for _, g := range strings.Split(dump, "\n\n") {
		if !strings.HasPrefix(strings.TrimSpace(g), "goroutine ") {
			continue
		}
		all++
		harness := false
		for _, f := range harnessFrames {
			if strings.Contains(g, f) {
				harness = true
				break
			}
		}
		if !harness {
			fusebox++
		}
	}
	return all, fusebox
}
