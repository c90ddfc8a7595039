package main

import (
	"runtime"
	"strings"
	"testing"
)

func TestCountGoroutines(t *testing.T) {
	dump := `goroutine 1 [running]:
main.main()
	/work/main/cmd/extproc/main.go:10 +0x1

goroutine 7 [IO wait]:
internal/poll.runtime_pollWait(0x1, 0x72)
github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest.(*Proxy).pipe(0xc0)
created by github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest.(*Proxy).serve in goroutine 6

goroutine 9 [select]:
google.golang.org/grpc/internal/transport.(*http2Server).keepalive(0xc0)
created by google.golang.org/grpc/internal/transport.NewServerTransport in goroutine 8

goroutine 11 [select]:
google.golang.org/grpc/internal/transport.(*http2Client).reader(0xc0)

goroutine 12 [chan receive]:
github.com/fusebox-llm/fusebox/test/e2e/envoysim.(*Proxy).run(0xc0)

goroutine 13 [select]:
github.com/fusebox-llm/fusebox/pkg/processor.(*Server).readAccessLogs(0xc0)
github.com/fusebox-llm/fusebox/pkg/processor.accessLogServer.StreamAccessLogs.func1()

goroutine 14 [select]:
github.com/fusebox-llm/fusebox/pkg/grpcwire.(*Workers).run(0xc0, 0xc1)
created by github.com/fusebox-llm/fusebox/pkg/grpcwire.(*Workers).Go in goroutine 8

goroutine 15 [chan receive]:
github.com/fusebox-llm/fusebox/pkg/grpcwire.(*stream).take(0xc0)
github.com/fusebox-llm/fusebox/pkg/grpcwire.(*stream).RecvMsg(0xc0)
github.com/fusebox-llm/fusebox/pkg/grpcwire.(*Workers).run(0xc0, 0xc1)
`
	all, fb, serving := countGoroutines(dump)
	// The idle worker (14) is not counted; the busy one (15) is.
	if all != 8 || fb != 4 || serving != 1 {
		t.Fatalf("all %d, fusebox's %d, serving %d; want 8, 4, 1", all, fb, serving)
	}
	if all, fb, _ := goroutineCounts(); all == 0 || fb == 0 || fb > all {
		t.Fatalf("this process: all %d, fusebox's %d", all, fb)
	}
}

// heapSites finds what a test keeps, by its allocation site, and growth
// names it.
func TestHeapSitesNameWhatGrew(t *testing.T) {
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = old }()
	runtime.GC()
	runtime.GC()
	before := heapSites()
	kept = make([][]byte, 64)
	for i := range kept {
		kept[i] = make([]byte, 16<<10)
	}
	runtime.GC()
	runtime.GC()
	g := growth(before, heapSites(), 3)
	if !strings.Contains(g, "TestHeapSitesNameWhatGrew") {
		t.Fatalf("growth does not name the test:%s", g)
	}
}

var kept [][]byte
