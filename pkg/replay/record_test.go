package replay

import (
	"encoding/json"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestRecordedLineKeepsTheGateway (#37, R-R8): a line record-log writes
// from Envoy's gRPC entry replays under the gateway and route the
// decision named (fusebox's own metadata carries them; the headers, when
// the logger lists them, win). Before, the line had no gateway, and every
// entry replayed as "default".
func TestRecordedLineKeepsTheGateway(t *testing.T) {
	fb, _ := structpb.NewStruct(map[string]any{"gateway": "tenant-a", "route": "a:r:m", "model": "m", "decision": "d1",
		"outcome": "failure", "reason": "provider_5xx"})
	at := time.Unix(1764590400, 0)
	e := &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: &accesslogdatav3.AccessLogCommon{
			StartTime: timestamppb.New(at), Duration: durationpb.New(12 * time.Millisecond), UpstreamCluster: "ca",
			ResponseFlags: &accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true},
			Metadata:      &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"fusebox": fb}},
		},
		Response: &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(503)},
	}
	b, err := json.Marshal(EntryLine(e))
	if err != nil {
		t.Fatal(err)
	}
	l, err := ParseLine(b)
	if err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if l.Gateway != "tenant-a" || l.Route != "a:r:m" || l.Flags != "UF" || l.Code != 503 || l.At != at.UnixNano() || l.Outcome != "failure" {
		t.Fatalf("%+v from %s", l, b)
	}
	// A header the logger lists wins over the metadata.
	e.Request = &accesslogdatav3.HTTPRequestProperties{RequestHeaders: map[string]string{"x-fusebox-gateway": "tenant-b"}}
	b, _ = json.Marshal(EntryLine(e))
	if l, _ := ParseLine(b); l.Gateway != "tenant-b" {
		t.Fatalf("gateway %q", l.Gateway)
	}
}
