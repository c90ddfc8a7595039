package main

import "testing"

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
`
	all, fb, serving := countGoroutines(dump)
	if all != 6 || fb != 3 || serving != 1 {
		t.Fatalf("all %d, fusebox's %d, serving %d; want 6, 3, 1", all, fb, serving)
	}
	if all, fb, _ := goroutineCounts(); all == 0 || fb == 0 || fb > all {
		t.Fatalf("this process: all %d, fusebox's %d", all, fb)
	}
}
