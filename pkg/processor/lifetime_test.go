package processor

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/streamlife"
)

// TestStreamLifetimeBounds (R-L13): a stream with no message for
// max_stream_idle, or older than max_stream_duration, is ended by fusebox:
// its decision is recorded as a neither (the probe slot freed), it is
// counted, and nothing of it stays (the stream count is back to zero).
// Before, a stream Envoy never finished was held for ever.
func TestStreamLifetimeBounds(t *testing.T) {
	cases := []lifetimeCase{
		{"idle", 200 * time.Millisecond, 0, false, metrics.RefusedStreamIdle},
		{"duration", 10 * time.Second, 400 * time.Millisecond, true, metrics.RefusedStreamDuration},
	}
	for _, tc := range cases {
		// On grpc-go's server a second goroutine watches the stream; on
		// fusebox's own transport a timer ends it (grpcwire.EndFunc).
		t.Run(tc.name+"/grpc-go", func(t *testing.T) { testStreamLifetime(t, tc, false) })
		t.Run(tc.name+"/grpcwire", func(t *testing.T) { testStreamLifetime(t, tc, true) })
	}
}

type lifetimeCase struct {
	name       string
	idle, max  time.Duration
	keepTalk   bool // a message every 40 ms: never idle
	wantReason string
}

func testStreamLifetime(t *testing.T, tc lifetimeCase, wire bool) {
	e := newEnvOn(t, testConfig, wire, func(o *Options) { o.StreamIdle, o.StreamDuration = tc.idle, tc.max })
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
	for e.srv.streams.Load() != 0 || testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "no_outcome", breaker.OriginLabel("neither", "no_outcome"))) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after the end: %d streams held, neither recorded %v", e.srv.streams.Load(),
				testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "no_outcome", breaker.OriginLabel("neither", "no_outcome"))))
		}
		time.Sleep(5 * time.Millisecond)
		e.clk.Advance(time.Second)
	}
}

// R-L13 for the access log channel: an idle access log stream is ended
// like an ext_proc stream, and access log streams count against
// max_concurrent_streams. Before, they obeyed neither (10,000 idle streams
// held 163 MB).
func TestAccessLogStreamsObeyTheLimits(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.StreamIdle, o.MaxStreams = 200*time.Millisecond, 1 })
	s, err := e.al.StreamAccessLogs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stream is counted", func() bool { return e.srv.streams.Load() == 1 })
	// A second stream of either kind is over the limit.
	s2, err := e.al.StreamAccessLogs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.CloseAndRecv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second stream over max_concurrent_streams 1: %v", err)
	}
	// The first is idle: ended by fusebox.
	eventually(t, "the idle stream is ended", func() bool { return e.srv.streams.Load() == 0 })
	if _, err := s.CloseAndRecv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("idle access log stream ended with %v", err)
	}
	if v := testutil.ToFloat64(e.metrics.Refused.WithLabelValues(metrics.RefusedStreamIdle)); v != 1 {
		t.Fatalf("stream_idle counted %v", v)
	}
}

// An access log message over 1 MiB is refused before it is decoded.
func TestCodecBoundsAccessLogMessages(t *testing.T) {
	big := &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{
		LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{{Request: &accesslogdatav3.HTTPRequestProperties{Path: strings.Repeat("x", extproc.MaxAccessLogMessage)}}}}}}
	raw, err := proto.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	var m accesslogv3.StreamAccessLogsMessage
	if err := (extproc.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &m); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a %d-byte message: %v", len(raw), err)
	}
	small, _ := proto.Marshal(logEntryMessage())
	if err := (extproc.Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(small)}, &m); err != nil {
		t.Fatal(err)
	}
}

func logEntryMessage() *accesslogv3.StreamAccessLogsMessage {
	return &accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{
		LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{logEntry{decision: "d", code: 503}.proto()}}}}
}

// A Server its streams ran on is collected once nothing uses it: the
// goroutines the lifetime watch reuses belong to no server. With a pool
// inside the Server, its idle workers kept it (its store, notes, history)
// alive after a restart, and the soaks' memory grew per restart.
func TestAServerIsNotKeptByItsStreamWorkers(t *testing.T) {
	collected := make(chan struct{})
	func() {
		rt, err := routes.Parse(routes.DefaultConfig(), routes.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s := NewServer(Options{Config: routes.NewHolder(rt), Store: breaker.NewMemory(nil), StreamIdle: time.Minute})
		runtime.AddCleanup(s, func(struct{}) { close(collected) }, struct{}{})
		done := make(chan struct{})
		_ = s.bounded(context.Background(), func(*streamlife.Activity) error { close(done); return nil })
		<-done
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		select {
		case <-collected:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the Server is still alive: something its streams ran on keeps it")
		}
	}
}
