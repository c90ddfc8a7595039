package main

import (
	"io"
	"log/slog"
	"net"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/processor"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// BenchmarkObserverProfile runs both profiles' lifecycles in process (the
// driver's cost included: for pprof, -cpuprofile; the out-of-process CPU
// figures are make bench-wire's).
func BenchmarkObserverProfile(b *testing.B) {
	for _, obs := range []bool{false, true} {
		cfg := routes.DefaultConfig()
		if obs {
			cfg = append([]byte("envoy: {observer: true}\n"), cfg...)
		}
		rt, err := routes.Parse(cfg, routes.Options{})
		if err != nil {
			b.Fatal(err)
		}
		srv := processor.NewServer(processor.Options{Config: routes.NewHolder(rt), Store: breaker.NewMemory(nil), Clock: breaker.SystemClock{}, Metrics: metrics.New(),
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		gs := grpc.NewServer(append(processor.TransportOptions(), grpc.ForceServerCodecV2(extproc.Codec{}))...)
		extprocv3.RegisterExternalProcessorServer(gs, srv)
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		go gs.Serve(ln)
		conn, _ := grpc.NewClient(ln.Addr().String(), envoyDialOptions()...)
		client := extprocv3.NewExternalProcessorClient(conn)
		l := newLifecycle()
		name := "sync"
		if obs {
			name = "observer"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var err error
				if obs {
					_, err = l.runObserver(client, nil)
				} else {
					_, err = l.run(client, nil)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		conn.Close()
		gs.Stop()
	}
}
