package main

import (
	"bytes"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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

// servingFrames mark a fusebox goroutine that serves an access log stream
// the harness holds open: Envoy keeps one per worker for as long as it
// runs, so they follow what the client left open (a first local reply
// after a restart opens one), not what fusebox leaked. The soak counts
// them apart and holds them to the streams envoysim has open.
var servingFrames = []string{
	"processor.accessLogServer.StreamAccessLogs",
	"processor.(*Server).readAccessLogs",
}

// idleWorkerFrame is the first frame of a goroutine that fusebox keeps for
// reuse (grpcwire.Workers: the transport's and the lifetime watch's), idle
// in its select: a bounded pool (Workers.MaxIdle each), which keeps the
// stacks its handlers grew, not a leak. A busy worker has its handler's
// frames above this one, and counts; so does a leaked handler.
const idleWorkerFrame = "github.com/fusebox-llm/fusebox/pkg/grpcwire.(*Workers).run("

// goroutineCounts returns all goroutines, fusebox's own (the harness's
// and idle pooled workers left out) and, of fusebox's, those serving an access log stream, from
// one dump of every stack.
func goroutineCounts() (all, fusebox, serving int) {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return countGoroutines(b.String())
}

func countGoroutines(dump string) (all, fusebox, serving int) {
	has := func(g string, frames []string) bool {
		for _, f := range frames {
			if strings.Contains(g, f) {
				return true
			}
		}
		return false
	}
	for _, g := range strings.Split(dump, "\n\n") {
		if !strings.HasPrefix(strings.TrimSpace(g), "goroutine ") {
			continue
		}
		all++
		if has(g, harnessFrames) {
			continue
		}
		if lines := strings.SplitN(strings.TrimSpace(g), "\n", 3); len(lines) > 1 && strings.HasPrefix(lines[1], idleWorkerFrame) {
			continue
		}
		fusebox++
		if has(g, servingFrames) {
			serving++
		}
	}
	return all, fusebox, serving
}

// raiseGoroutineMark runs n goroutines at once and lets them end, and
// returns how much the live heap grew by it. The runtime never frees a
// goroutine's descriptor: it keeps every one it made for reuse, so a load
// whose peak passes every earlier peak leaves the heap larger by the
// difference (190 KiB in an observer soak whose load peaked above its
// warm-up) with nothing retained. Raised before the baseline, above any
// peak the load reaches, the descriptors are in both measurements, and the
// memory check leaves the bytes returned here out of the 10 % it allows.
func raiseGoroutineMark(n int) int64 {
	// A second campaign in the same process finds the mark raised by the
	// first: the heap does not grow, yet holds all those descriptors, so
	// it gets the first one's measure.
	if n <= raised.n {
		return raised.bytes
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	var started, done sync.WaitGroup
	release := make(chan struct{})
	started.Add(n)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			started.Done()
			<-release
		}()
	}
	started.Wait()
	close(release)
	done.Wait()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	grew := max(int64(ms.HeapAlloc)-int64(before), 0)
	if raised.n > 0 { // raised from a lower mark: that one's bytes, and these
		grew += raised.bytes
	}
	raised.n, raised.bytes = n, grew
	return grew
}

// raised is the highest mark this process raised, and what its
// descriptors take (raiseGoroutineMark).
var raised struct {
	n     int
	bytes int64
}

// peakGoroutines samples runtime.NumGoroutine every 20 ms until stop and
// keeps the largest.
type peakGoroutines struct {
	peak atomic.Int64
	stop chan struct{}
	done sync.WaitGroup
}

func samplePeak() *peakGoroutines {
	p := &peakGoroutines{stop: make(chan struct{})}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			n := int64(runtime.NumGoroutine())
			if n > p.peak.Load() {
				p.peak.Store(n)
			}
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p
}

// end stops the sampling and returns the peak.
func (p *peakGoroutines) end() int {
	close(p.stop)
	p.done.Wait()
	return int(p.peak.Load())
}
