package processor

import (
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStreamLifetimeBounds (R-L13): a stream with no message for
// max_stream_idle, or older than max_stream_duration, is ended by fusebox:
// its decision is recorded as a neither (the probe slot freed), it is
// counted, and nothing of it stays (the stream count is back to zero).
// Before, a stream Envoy never finished was held for ever.
func TestStreamLifetimeBounds(t *testing.T) {
	cases := []struct {
		name       string
		idle, max  time.Duration
		keepTalk   bool // a message every 40 ms: never idle
		wantReason string
	}{
		{"idle", 200 * time.Millisecond, 0, false, metrics.RefusedStreamIdle},
		{"duration", 10 * time.Second, 400 * time.Millisecond, true, metrics.RefusedStreamDuration},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.StreamIdle, o.StreamDuration = tc.idle, tc.max })
			start := time.Now()
			c := e.open("")
			defer c.cancel()
			c.chat("gpt")
			errc := make(chan error, 1)
			go func() {
				for {
					if _, err := c.stream.Recv(); err != nil {
						errc <- err
						return
					}
				}
			}()
			var err error
			tick := time.NewTicker(40 * time.Millisecond)
			defer tick.Stop()
		wait:
			for {
				select {
				case err = <-errc:
					break wait
				case <-tick.C:
					if tc.keepTalk {
						// Request trailers: a message the route role answers.
						_ = c.stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the stream was not ended within 5 s")
				}
			}
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("stream ended with %v, want DeadlineExceeded", err)
			}
			bound := tc.max
			if bound == 0 {
				bound = tc.idle
			}
			// The idle bound counts from the last message (after the chat).
			if el := time.Since(start); el < bound-50*time.Millisecond {
				t.Fatalf("ended after %s: before its bound", el)
			}
			if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(tc.wantReason)); v != 1 {
				t.Fatalf("%s counted %v", tc.wantReason, v)
			}
			deadline := time.Now().Add(5 * time.Second)
			// The decision's wait for an entry runs on the injected clock.
			for e.srv.streams.Load() != 0 || testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "no_outcome")) != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("after the end: %d streams held, neither recorded %v", e.srv.streams.Load(),
						testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "no_outcome")))
				}
				time.Sleep(5 * time.Millisecond)
				e.clk.Advance(time.Second)
			}
		})
	}
}
