package grpcwire

import (
	"bytes"
	"runtime"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
)

// A message that arrived before the client's RST_STREAM is the handler's
// to read, even when both arrived while the handler waited in Recv: Envoy
// sent it (the response's last chunk, whose reply then timed out) before
// it reset the stream, and fusebox judges the response by it (R-DL14).
// Before, a handler woken after both frames saw the cancelled context
// first and never read the message: a loaded soak counted a completed
// response as a client_cancel. One P makes the order sure: the reader
// handles both frames before the handler runs.
func TestAMessageBeforeAResetIsRead(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	got := make(chan int, 1)
	ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		n := 0
		for {
			if _, err := s.Recv(); err != nil {
				got <- n
				return err
			}
			n++
			if n == 1 {
				if err := s.Send(&extprocv3.ProcessingResponse{}); err != nil {
					got <- n
					return err
				}
			}
		}
	})
	for i := range 20 {
		r := dialRaw(t, ts.addr)
		r.headers(1, false, envoyHeaders(processPath)...)
		r.data(1, false, msg(&extprocv3.ProcessingRequest{}))
		// The reply is out: the handler is in its second Recv.
		r.next(func(f http2.Frame) bool { d, ok := f.(*http2.DataFrame); return ok && d.StreamID == 1 })
		var b bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		_ = fr.WriteData(1, false, msg(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}}))
		_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
		if _, err := r.c.Write(b.Bytes()); err != nil {
			t.Fatal(err)
		}
		if n := <-got; n != 2 {
			t.Fatalf("round %d: the handler read %d messages, want 2 (the one before the reset)", i, n)
		}
		r.c.Close()
	}
}
