package grpcwire

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Interop (#50): nghttp2 is one of the HTTP/2 codecs Envoy builds in, and
// its clients (h2load, nghttp from Debian's nghttp2-client) are another
// implementation than the grpc-go client every other test uses. Run under
// -race by make test. h2load opens many streams on few connections, each
// one gRPC message and END_STREAM; nghttp sends large messages through
// small windows, so that every one is cut across many DATA frames and
// window updates. The handler checks every message it is given byte for
// byte, and every stream must end with 200 and grpc-status 0.
func TestInteropNghttp2(t *testing.T) {
	h2load, err1 := exec.LookPath("h2load")
	nghttp, err2 := exec.LookPath("nghttp")
	if err1 != nil || err2 != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("h2load and nghttp (Debian nghttp2-client) are needed: .ci/run installs them")
		}
		t.Skip("no h2load or nghttp (Debian nghttp2-client)")
	}
	var streams, good, bad atomic.Int64
	var want atomic.Pointer[[]byte]
	ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		streams.Add(1)
		for {
			m, err := s.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if body := m.GetRequestBody().GetBody(); bytes.Equal(body, *want.Load()) {
				good.Add(1)
			} else {
				bad.Add(1)
			}
			if err := s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}); err != nil {
				return err
			}
		}
	})
	url := "http://" + ts.addr + processPath
	hdrs := []string{"-H", "content-type: application/grpc", "-H", "te: trailers"}
	dir := t.TempDir()
	file := func(size int) string {
		body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
		want.Store(&body)
		p := filepath.Join(dir, strconv.Itoa(size))
		m := msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body}}})
		if err := os.WriteFile(p, m, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, tail(out.String()))
			}
		case <-time.After(3 * time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("%s did not finish in 3 minutes\n%s", name, tail(out.String()))
		}
		return out.String()
	}
	reset := func() { streams.Store(0); good.Store(0); bad.Store(0) }

	t.Run("h2load: many small streams", func(t *testing.T) {
		reset()
		const n = 30000
		out := run(h2load, append([]string{"-n", strconv.Itoa(n), "-c", "4", "-m", "64", "-d", file(256)}, append(hdrs, url)...)...)
		if !regexp.MustCompile(`(?m)requests: `+strconv.Itoa(n)+` total, `+strconv.Itoa(n)+` started, `+strconv.Itoa(n)+` done, `+strconv.Itoa(n)+` succeeded, 0 failed, 0 errored, 0 timeout`).MatchString(out) ||
			!strings.Contains(out, "status codes: "+strconv.Itoa(n)+" 2xx") {
			t.Fatalf("h2load:\n%s", tail(out))
		}
		if streams.Load() != n || good.Load() != n || bad.Load() != 0 {
			t.Fatalf("handler: %d streams, %d messages intact, %d not", streams.Load(), good.Load(), bad.Load())
		}
	})

	t.Run("nghttp: large messages through small windows", func(t *testing.T) {
		reset()
		const rounds, per = 10, 20
		body := file(300 << 10)
		for range rounds {
			// -w/-W 14: 16 KiB stream and connection windows, so a 300 KB
			// message waits on window updates about 19 times.
			out := run(nghttp, append([]string{"-n", "-v", "-w", "14", "-W", "14", "-m", strconv.Itoa(per), "-d", body}, append(hdrs, url)...)...)
			if got := strings.Count(out, "grpc-status: 0"); got != per {
				t.Fatalf("%d of %d streams ended with grpc-status 0\n%s", got, per, tail(out))
			}
		}
		if good.Load() != rounds*per || bad.Load() != 0 {
			t.Fatalf("handler: %d messages intact, %d not, want %d", good.Load(), bad.Load(), rounds*per)
		}
	})
}

// tail is the end of a tool's output, for a failure message.
func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}
