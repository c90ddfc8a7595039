package processor

import (
	"strings"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/judge"
	"github.com/fusebox-llm/fusebox/pkg/lifecycle"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// decisionOf reads fusebox.decision from a decision reply.
func decisionOf(t *testing.T, r *extprocv3.ProcessingResponse) string {
	t.Helper()
	id := r.GetDynamicMetadata().GetFields()["fusebox"].GetStructValue().GetFields()["decision"].GetStringValue()
	if len(id) != 32 {
		t.Fatalf("decision id %q: want 128 bits in hex", id)
	}
	return id
}

// logEntry is an HTTP access log entry as Envoy's http_grpc logger writes
// it for a request fusebox decided.
type logEntry struct {
	decision, cluster string
	code              uint32
	details           string
	flags             *accesslogdatav3.ResponseFlags
	attempt           uint32
}

func (l logEntry) proto() *accesslogdatav3.HTTPAccessLogEntry {
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	if l.decision != "" {
		md.FilterMetadata["fusebox"] = &structpb.Struct{Fields: map[string]*structpb.Value{"decision": structpb.NewStringValue(l.decision)}}
	}
	return &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{UpstreamCluster: l.cluster, ResponseFlags: l.flags, Metadata: md,
			Duration: durationpb.New(30 * time.Millisecond), UpstreamRequestAttemptCount: l.attempt},
		Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(l.code), ResponseCodeDetails: l.details},
	}
}

// alStream is one Envoy worker's access log stream.
type alStream struct {
	t *testing.T
	s accesslogv3.AccessLogService_StreamAccessLogsClient
}

func (e *env) accessLog() *alStream {
	e.t.Helper()
	s, err := e.al.StreamAccessLogs(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	a := &alStream{t: e.t, s: s}
	a.sendRaw(&accesslogv3.StreamAccessLogsMessage{Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{LogName: "fusebox"}})
	eventually(e.t, "the access log stream is connected", func() bool { return e.srv.alStreams.Load() > 0 })
	return a
}

func (a *alStream) sendRaw(m *accesslogv3.StreamAccessLogsMessage) {
	if err := a.s.Send(m); err != nil {
		a.t.Fatal(err)
	}
}

func (a *alStream) send(es ...logEntry) {
	var list []*accesslogdatav3.HTTPAccessLogEntry
	for _, e := range es {
		list = append(list, e.proto())
	}
	a.sendRaw(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: list}}})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (e *env) entries(result string) float64 {
	return testutil.ToFloat64(e.metrics.AccessLogEntries.WithLabelValues(result))
}

var (
	uf  = &accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true}
	ut  = &accesslogdatav3.ResponseFlags{UpstreamRequestTimeout: true}
	nc  = &accesslogdatav3.ResponseFlags{NoClusterFound: true}
	uo  = &accesslogdatav3.ResponseFlags{UpstreamOverflow: true}
	dc  = &accesslogdatav3.ResponseFlags{DownstreamConnectionTermination: true}
	dr  = &accesslogdatav3.ResponseFlags{DownstreamRemoteReset: true}
	si  = &accesslogdatav3.ResponseFlags{StreamIdleTimeout: true}
	ur  = &accesslogdatav3.ResponseFlags{UpstreamRemoteReset: true}
	urx = &accesslogdatav3.ResponseFlags{UpstreamRetryLimitExceeded: true}
)

// TestAccessLogEntryJudgesWhatTheRouteRoleNeverSaw (R-AL3, R-AL4): on Envoy
// 1.34–1.36 the route role's stream ends with no response for Envoy's own
// local replies; the access log entry, before or after that end, records
// the outcome its flags say, once.
func TestAccessLogEntryJudgesWhatTheRouteRoleNeverSaw(t *testing.T) {
	cases := []struct {
		name          string
		entryFirst    bool
		code          uint32
		details       string
		flags         *accesslogdatav3.ResponseFlags
		noCluster     bool
		class, reason string
	}{
		{"refused connection, entry after the stream", false, 503, "upstream_reset_before_response_started{remote_connection_failure}", uf, false, "failure", "connection_error"},
		{"refused connection, entry before the stream ends", true, 503, "upstream_reset_before_response_started{remote_connection_failure}", uf, false, "failure", "connection_error"},
		{"route timeout", false, 504, "upstream_response_timeout", ut, false, "failure", "timeout"},
		{"no cluster", false, 503, "cluster_not_found", nc, true, "neither", "cluster_not_found"},
		{"overflow", false, 503, "upstream_reset_before_response_started{overflow}", uo, true, "neither", "envoy_overflow"},
		{"client went away", false, 0, "downstream_remote_disconnect", dc, false, "neither", "client_cancel"},
		// R-AL4: an HTTP/2 client's reset (DR) is a client that went away.
		{"HTTP/2 client reset", false, 200, "via_upstream", dr, false, "neither", "client_cancel"},
		// R-AL4: Envoy's timer cut an answer that had begun. Before, the
		// route timeout's 200 with UT was a client_cancel.
		{"route timeout cut a flowing answer", false, 200, "via_upstream", ut, false, "neither", "cut_mid_answer"},
		{"stream idle timeout mid-answer", false, 200, "via_upstream", si, false, "neither", "cut_mid_answer"},
		// R-O9: the provider reset its stream after the answer began (UR
		// on a 200). Before, a client_cancel, though the client stayed.
		{"upstream reset mid-answer", false, 200, "upstream_reset_after_response_started{remote_reset}", ur, false, "neither", "stream_error"},
		{"upstream reset mid-answer (via_upstream)", false, 200, "via_upstream", ur, false, "neither", "stream_error"},
		// The provider's 500 whose body broke: its status is its answer.
		// Before, a connection error.
		{"provider 500, then reset", false, 500, "upstream_reset_after_response_started{remote_reset}", ur, false, "failure", "provider_5xx"},
		{"provider 503 after retries (via_upstream)", false, 503, "via_upstream", urx, false, "failure", "provider_5xx"},
		// The retry resource refused the retry of the provider's 503: UO
		// on its own answer. Before, an envoy_overflow neither.
		{"provider 503, retry refused (via_upstream)", false, 503, "via_upstream", uo, false, "failure", "provider_5xx"},
		// R-O15: a refused connection whose retry the cluster's retry
		// circuit breaker refused (UF|UO) is that connection failure.
		// Before, UO was checked first: a neither.
		{"refused connection, retry overflowed", false, 503, "upstream_reset_before_response_started{remote_connection_failure}",
			&accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true, UpstreamOverflow: true}, false, "failure", "connection_error"},
		// R-AL4: Envoy's own timeouts. A provider that stalls before its
		// headers meets the stream idle timeout (SI); before, not mapped.
		{"stream idle timeout", false, 504, "stream_idle_timeout", &accesslogdatav3.ResponseFlags{StreamIdleTimeout: true}, false, "failure", "timeout"},
		{"max stream duration", false, 504, "upstream_max_stream_duration_reached", &accesslogdatav3.ResponseFlags{UpstreamMaxStreamDurationReached: true}, false, "failure", "timeout"},
		{"duration timeout", false, 504, "duration_timeout", &accesslogdatav3.ResponseFlags{DurationTimeout: true}, false, "failure", "timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			al := e.accessLog()
			c := e.open("")
			id := decisionOf(t, c.chat("gpt"))
			entry := logEntry{decision: id, cluster: "c_openai_us", code: tc.code, details: tc.details, flags: tc.flags}
			if tc.noCluster {
				entry.cluster = ""
			}
			if tc.entryFirst {
				al.send(entry)
				eventually(t, "the entry is read", func() bool { return e.entries(EntryRecorded) == 1 })
			}
			c.end() // what the route role sees on 1.36: the stream closing
			if !tc.entryFirst {
				al.send(entry)
			}
			eventually(t, "the outcome is recorded", func() bool {
				return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", tc.class, tc.reason, breaker.OriginLabel(tc.class, tc.reason))) == 1
			})
			// The same entry again (Envoy never does; a replay might) is a
			// duplicate, and nothing is recorded twice.
			al.send(entry)
			eventually(t, "the duplicate is counted", func() bool { return e.entries(EntryDuplicate) == 1 })
			if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "client_cancel", breaker.OriginLabel("neither", "client_cancel"))); tc.reason != "client_cancel" && v != 0 {
				t.Fatalf("also recorded as a client cancel: %v", v)
			}
		})
	}
}

// TestAccessLogNeverRecordsTwice (R-AL3): where the route role sees the
// local reply itself (Envoy <= 1.33, >= 1.37), its own outcome stands and
// the entry that follows is a duplicate.
func TestAccessLogNeverRecordsTwice(t *testing.T) {
	e := newEnv(t)
	al := e.accessLog()
	c := e.open("")
	id := decisionOf(t, c.chat("gpt"))
	c.respHeaders("503", false, attrs(judge.FlagUF, "upstream_reset_before_response_started{connection_failure}"), "content-type", "text/plain")
	c.end()
	al.send(logEntry{decision: id, cluster: "c_openai_us", code: 503, details: "upstream_reset_before_response_started{connection_failure}", flags: uf})
	eventually(t, "the entry is read", func() bool { return e.entries(EntryDuplicate) == 1 })
	if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "failure", "connection_error", breaker.OriginLabel("failure", "connection_error"))); v != 1 {
		t.Fatalf("connection_error recorded %v times", v)
	}
}

// TestForgedAccessLogEntryRecordsNothing (R-AL2, R-AL4): an entry naming no
// decision fusebox made, or naming one with another route's cluster, is
// dropped and counted; the decision it named still ends as a neither.
func TestForgedAccessLogEntryRecordsNothing(t *testing.T) {
	rt, err := routes.Parse([]byte("access_log: {wait_ms: 50}\n"+testConfig), routes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.holder.Store(rt)
	al := e.accessLog()
	c := e.open("")
	id := decisionOf(t, c.chat("gpt"))
	c.end()
	al.send(
		logEntry{decision: "00000000000000000000000000000000", cluster: "c_openai_us", code: 503, flags: uf},
		logEntry{decision: id, cluster: "c_azure_eu", code: 503, flags: uf},
		logEntry{cluster: "c_openai_us", code: 503, flags: uf},
	)
	eventually(t, "the forged entries are counted", func() bool {
		return e.entries(EntryUnknown) == 1 && e.entries(EntryClusterMismatch) == 1 && e.entries(EntryNoDecision) == 1
	})
	e.clk.Advance(60 * time.Millisecond)
	eventually(t, "the decision ends as a neither after access_log.wait_ms", func() bool {
		return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "no_outcome", breaker.OriginLabel("neither", "no_outcome"))) == 1
	})
	for _, r := range []string{"openai:us:gpt", "azure:eu:gpt"} {
		if v := testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", r, "failure", "connection_error", breaker.OriginLabel("failure", "connection_error"))); v != 0 {
			t.Fatalf("%s: a forged entry recorded a failure", r)
		}
	}
	if e.srv.decisions.len() != 0 {
		t.Fatalf("%d decisions still kept", e.srv.decisions.len())
	}
}

// TestNoAccessLogStreamStillEnds (R-AL6): without the channel a stream that
// ends with no response is still a neither, once access_log.wait_ms has
// passed (Envoy opens its access log stream only at its first entry, so
// fusebox cannot tell "not configured" from "not yet"); with wait_ms 0 at
// once.
func TestNoAccessLogStreamStillEnds(t *testing.T) {
	for _, wait := range []string{"50", "0"} {
		rt, err := routes.Parse([]byte("access_log: {wait_ms: "+wait+"}\n"+testConfig), routes.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t)
		e.holder.Store(rt)
		c := e.open("")
		c.chat("gpt")
		c.end()
		reason := "client_cancel" // wait_ms 0: nothing waits, the stream's end is all there is
		if wait == "0" && e.srv.decisions.len() != 0 {
			t.Fatal("wait_ms 0: the decision is still kept")
		}
		if wait != "0" {
			reason = "no_outcome"
			e.clk.Advance(60 * time.Millisecond)
		}
		eventually(t, "the neither is recorded", func() bool {
			return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", reason, breaker.OriginLabel("neither", reason))) == 1
		})
		if e.srv.decisions.len() != 0 {
			t.Fatal("a decision is still kept")
		}
	}
}

// An entry that reaches another replica than the one that decided (Envoy's
// access log stream goes to one replica per worker) still records the
// outcome, once, in either order: the decision waits in its note in the
// store (meet.go). Before, the other replica counted it unknown_decision
// and the deciding one recorded a neither after wait_ms: on Envoy
// 1.34–1.36 with several replicas a refused connection was lost half the
// time.
func TestAccessLogEntryOnAnotherReplica(t *testing.T) {
	for _, entryFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "entry after the stream", true: "entry before the stream ends"}[entryFirst], func(t *testing.T) {
			a := newEnv(t)
			b := a.replica()
			al := b.accessLog()
			c := a.open("")
			id := decisionOf(t, c.chat("gpt"))
			entry := logEntry{decision: id, cluster: "c_openai_us", code: 503, details: "upstream_reset_before_response_started{remote_connection_failure}", flags: uf}
			if entryFirst {
				al.send(entry)
				eventually(t, "the entry waits in the note", func() bool { return b.entries(EntryUnknown) == 1 })
			}
			c.end()
			if !entryFirst {
				al.send(entry)
			}
			connErr := func(e *env) float64 {
				return testutil.ToFloat64(e.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "failure", "connection_error", breaker.OriginLabel("failure", "connection_error")))
			}
			eventually(t, "the connection error is recorded once", func() bool { return connErr(a)+connErr(b) == 1 })
			if s := a.status("default", "openai:us:gpt"); s.WindowFailures != 1 {
				t.Fatalf("window failures %d", s.WindowFailures)
			}
			// The deciding replica's wait ends (wait_ms, on the injected
			// clock): no second record.
			a.clk.Advance(3 * time.Second)
			if a.srv.decisions.len() != 0 {
				t.Fatal("the decision is still kept after its wait")
			}
			if n := testutil.ToFloat64(a.metrics.Outcomes.WithLabelValues("default", "openai:us:gpt", "neither", "no_outcome", breaker.OriginLabel("neither", "no_outcome"))); n != 0 {
				t.Fatalf("also recorded as a neither: %v", n)
			}
			if connErr(a)+connErr(b) != 1 {
				t.Fatal("recorded twice")
			}
		})
	}
}

// #50: on fusebox's own transport an access log message over its 1 MiB
// bound is refused on its length prefix, before it is buffered, and
// counted as message_too_large. Before, the transport buffered the whole
// message (eight 20 MiB entries: 601 MB) and the refusal went uncounted.
func TestAnOversizedAccessLogMessageIsCounted(t *testing.T) {
	e := newEnvOn(t, testConfig, true)
	s, err := e.al.StreamAccessLogs(e.t.Context())
	if err != nil {
		t.Fatal(err)
	}
	big := logEntry{decision: lifecycle.NewDecisionID(), cluster: "c_openai_us", code: 503, flags: uf}.proto()
	big.Response.ResponseCodeDetails = strings.Repeat("x", 2<<20)
	_ = s.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogdatav3.HTTPAccessLogEntry{big}}}})
	eventually(t, "counted as message_too_large", func() bool {
		return testutil.ToFloat64(e.metrics.Refused.WithLabelValues(metrics.RefusedMessageTooLarge)) == 1
	})
}
