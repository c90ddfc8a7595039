//go:build poison

package grpcwire

import (
	"bytes"
	"testing"
	"unsafe"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// The poison build catches what -race cannot (#50): a handler that keeps
// an aliased message past its next receive reads poisoned bytes, so the
// test that does so fails. Here a handler does it on purpose, and the
// bytes it kept must read as poison.
func TestThePoisonBuildCatchesAKeptMessage(t *testing.T) {
	var last []byte
	kept := make(chan []byte, 1)
	ts := serve(t, Options{Codec: aliasProto{bytesProto{encodingProto()}, &last, false}}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		first := last // aliases the transport's buffer until the next receive
		if _, err := s.Recv(); err != nil {
			return err
		}
		kept <- first
		return nil
	})
	c, err := extprocv3.NewExternalProcessorClient(ts.client(t)).Process(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		body := bytes.Repeat([]byte{byte('a' + i)}, 600)
		if err := c.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body}}}); err != nil {
			t.Fatal(err)
		}
	}
	b := <-kept
	if !bytes.Equal(b, bytes.Repeat([]byte{0xdb}, len(b))) {
		t.Fatalf("a message kept past the next receive still reads as it was: the poison build would miss the bug")
	}
}

// A buffer given back in the poison build stays poison: the pool never
// hands it out again, so a kept alias can only read poison, whatever
// arrives after it (under load, the next message could be read into the
// very buffer a handler kept, and the kept message read as that one).
func TestThePoisonBuildNeverReusesABuffer(t *testing.T) {
	given := map[*byte]bool{}
	for range 200 {
		b := getBuf(600)
		if given[unsafe.SliceData(b)] {
			t.Fatal("a buffer given back was handed out again: a kept alias would read the next message")
		}
		b[0] = 'x'
		putBuf(b)
		given[unsafe.SliceData(b)] = true
		if b[0] != 0xdb {
			t.Fatal("a buffer given back was not poisoned")
		}
	}
}
