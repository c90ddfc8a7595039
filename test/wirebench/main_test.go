package main

import (
	"bytes"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// A short run of the whole measurement: both servers start, every
// lifecycle completes, and the report has its figures.
func TestWirebenchRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := t.TempDir()
	fb, nl := filepath.Join(dir, "extproc"), filepath.Join(dir, "nullproc")
	for bin, pkg := range map[string]string{fb: "github.com/fusebox-llm/fusebox/cmd/extproc", nl: "github.com/fusebox-llm/fusebox/test/wirebench/nullproc"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	rep, err := Run(fb, nl, 300, 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	// Both transports over TCP and a Unix socket, in the same rounds.
	tr, err := Transports(fb, nl, 100, 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range tr.Variants {
		if len(tr.Sync[i]) != 1 || tr.Sync[i][0] <= 0 || tr.Observer[i][0] <= 0 {
			t.Fatalf("%v: sync %v observer %v", v, tr.Sync[i], tr.Observer[i])
		}
	}
	var tb bytes.Buffer
	tr.Print(&tb)
	if !strings.Contains(tb.String(), "grpc-go   uds") || !strings.Contains(tb.String(), "fusebox   tcp") {
		t.Fatalf("transports report:\n%s", tb.String())
	}
	for _, r := range []*Result{rep.Null, rep.Fusebox, rep.NullTuned} {
		if r.Requests != 300 || len(r.Latencies) != 300*53 || r.CPU <= 0 {
			t.Fatalf("%s: %d requests, %d latencies, cpu %v", r.Name, r.Requests, len(r.Latencies), r.CPU)
		}
	}
	// The observer profile: only the two request-path messages wait.
	for _, o := range []*Result{rep.Observer, rep.NullObserver} {
		if o.Requests != 300 || len(o.Latencies) != 300*2 || o.CPU <= 0 {
			t.Fatalf("%s: %d requests, %d latencies, cpu %v", o.Name, o.Requests, len(o.Latencies), o.CPU)
		}
	}
	var b bytes.Buffer
	rep.Print(&b)
	if !strings.Contains(b.String(), "fusebox/null: cpu") || !strings.Contains(b.String(), "observer/null: cpu") ||
		!strings.Contains(b.String(), "observer/null-obs") || !strings.Contains(b.String(), "over null-wire") {
		t.Fatalf("report:\n%s", b.String())
	}
}

// The driver opens its streams as Envoy opens an ext_proc stream: with no
// grpc-timeout (docs/envoy.md, "Every side stream is an HTTP/2 request
// built by Common::prepareHeaders"). Before, it sent one on every stream,
// and every server under test set a deadline timer for it.
func TestTheDriverSendsNoTimeout(t *testing.T) {
	var deadlines, streams atomic.Int64
	addr := serveSpy(t, deadlineSpy{deadlines: &deadlines, streams: &streams})
	conn, err := grpc.NewClient(addr, envoyDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	l := newLifecycle()
	if _, err := l.run(client, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := l.runObserver(client, nil); err != nil {
		t.Fatal(err)
	}
	if streams.Load() != 3 || deadlines.Load() != 0 {
		t.Fatalf("%d of %d streams came with a deadline (grpc-timeout)", deadlines.Load(), streams.Load())
	}
}

// deadlineSpy answers every message with an empty reply of its kind and
// counts the streams that came with a deadline.
type deadlineSpy struct {
	extprocv3.UnimplementedExternalProcessorServer
	deadlines, streams *atomic.Int64
}

func (d deadlineSpy) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	d.streams.Add(1)
	if _, ok := s.Context().Deadline(); ok {
		d.deadlines.Add(1)
	}
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		var resp *extprocv3.ProcessingResponse
		switch req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_RequestBody:
			// The observe note the driver forwards to its observer stream.
			note, _ := structpb.NewStruct(map[string]any{"fusebox.observe": map[string]any{"note": "n"}})
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}, DynamicMetadata: note}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		default:
			continue
		}
		if req.GetObservabilityMode() {
			if req.GetResponseBody().GetEndOfStream() {
				return nil // fusebox ends an observer stream once it recorded
			}
			continue
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

// serveSpy serves spy on a loopback port until the test ends.
func serveSpy(t *testing.T, spy deadlineSpy) string {
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, spy)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}
