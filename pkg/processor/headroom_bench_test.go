package processor

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// BenchmarkResponsePathHeadroom (#38): one whole request (53 messages, as
// BenchmarkLifecycle) whose response announces no quota, one that
// announces it (the headers parsed and shown, R-H1, R-H4), and one whose
// route has a headroom policy as well (judged into the record, R-H2), in
// the same run: the response path's cost with headroom against without.
func BenchmarkResponsePathHeadroom(b *testing.B) {
	announced := []string{":status", "200", "content-type", "text/event-stream", "x-request-id", "0f7c",
		"x-ratelimit-limit-requests", "10000", "x-ratelimit-remaining-requests", "9999", "x-ratelimit-reset-requests", "6ms",
		"x-ratelimit-limit-tokens", "30000000", "x-ratelimit-remaining-tokens", "29999000", "x-ratelimit-reset-tokens", "2ms"}
	withHeadroom := strings.Replace(testConfig, "cooldown_ms: 10000}", "cooldown_ms: 10000, headroom: {min_requests: 5, min_tokens: 1000}}", 1)
	for _, tc := range []struct {
		name, config string
		headers      []string
	}{
		{"none-announced", testConfig, nil},
		{"announced", testConfig, announced},
		{"announced-with-policy", withHeadroom, announced},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := newLifecycle()
			if tc.headers != nil {
				l.respHeaders = &extprocv3.ProcessingRequest{
					Request:    &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(tc.headers...)}},
					Attributes: attrs(0, "via_upstream"),
				}
			}
			rt, err := routes.Parse([]byte(tc.config), routes.Options{})
			if err != nil {
				b.Fatal(err)
			}
			clk := breaker.NewCoarseClock(time.Millisecond)
			b.Cleanup(clk.Stop)
			srv := NewServer(Options{Config: routes.NewHolder(rt), Store: breaker.NewMemory(nil), Clock: clk,
				Metrics: metrics.New(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			client := benchServer(b, srv)
			l.run(b, client)
			b.ReportAllocs()
			b.ResetTimer()
			c0 := cpuTime()
			for b.Loop() {
				l.run(b, client)
			}
			b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
		})
	}
}
