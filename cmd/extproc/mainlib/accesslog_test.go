package mainlib

import (
	"context"
	"strings"
	"testing"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestAccessLogServiceOnTheExtProcListener (R-AL1, R-AL6): the access log
// service answers on the ext_proc listener, and /readyz says whether a
// stream is connected, without making fusebox unready either way.
func TestAccessLogServiceOnTheExtProcListener(t *testing.T) {
	in := startConfig(t, "", &syncBuffer{})
	ready := func() string {
		code, body := get(t, "http://"+in.AdminAddr()+"/readyz", "")
		if code != 200 {
			t.Fatalf("/readyz %d %s", code, body)
		}
		return body
	}
	if b := ready(); !strings.Contains(b, `"access_log":{"ready":true,"detail":"not connected"}`) {
		t.Fatalf("/readyz before a stream: %s", b)
	}
	conn, err := grpc.NewClient(in.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := accesslogv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&accesslogv3.StreamAccessLogsMessage{Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{LogName: "fusebox"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/readyz says connected", func() bool { return strings.Contains(ready(), `"detail":"connected (1 streams)"`) })
	cancel()
	waitFor(t, "/readyz says not connected", func() bool { return strings.Contains(ready(), `"access_log":{"ready":true,"detail":"not connected"}`) })
}
