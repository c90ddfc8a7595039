package extproc

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Which messages the fast decoder takes, and that what it makes of them is
// what proto makes of them (metadata_context dropped from bodies).
func TestDecodeBodyMessageShapes(t *testing.T) {
	marshal := func(m *extprocv3.ProcessingRequest) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	reqBody := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m"}`), EndOfStream: true}}}
	last := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}}
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}
	withProtocol := proto.Clone(reqBody).(*extprocv3.ProcessingRequest)
	withProtocol.ProtocolConfig = &extprocv3.ProtocolConfiguration{SendBodyWithoutWaitingForHeaderResponse: true}
	twice := append(marshal(bodyWithMetadata()), marshal(bodyWithMetadata())...)
	unknownInBody := protowire.AppendTag(nil, fieldResponseBody, protowire.BytesType)
	unknownInBody = protowire.AppendBytes(unknownInBody, protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	for _, c := range []struct {
		name string
		b    []byte
		fast bool
	}{
		{"a streamed chunk with the forwarded metadata", marshal(bodyWithMetadata()), true},
		{"the buffered request body", marshal(reqBody), true},
		{"the last, empty chunk", marshal(last), true},
		{"response headers", marshal(headers), false},
		{"a body with protocol_config (the first message)", marshal(withProtocol), false},
		{"a body twice (proto merges them)", twice, false},
		{"an unknown field in the body", unknownInBody, false},
		{"nothing", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got extprocv3.ProcessingRequest
			if fast := DecodeBodyMessage(c.b, &got, false); fast != c.fast {
				t.Fatalf("fast path %v, want %v", fast, c.fast)
			}
			var viaCodec, want extprocv3.ProcessingRequest
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(c.b)}, &viaCodec); err != nil {
				if c.fast {
					t.Fatal(err)
				}
				return
			}
			if err := proto.Unmarshal(dropBodyMetadata(c.b), &want); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&viaCodec, &want) {
				t.Fatalf("decoded %v, want %v", &viaCodec, &want)
			}
		})
	}
}

// The decoder resets what it decodes into, as proto does: nothing of an
// earlier message stays.
func TestDecodeBodyMessageResets(t *testing.T) {
	m := bodyWithMetadata()
	m.Attributes = map[string]*structpb.Struct{"x": {}}
	b, _ := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("y")}}})
	if !DecodeBodyMessage(b, m, false) {
		t.Fatal("not decoded")
	}
	if m.Attributes != nil || m.MetadataContext != nil || m.ObservabilityMode || string(m.GetResponseBody().GetBody()) != "y" {
		t.Fatalf("left over: %v", m)
	}
}

// FuzzDecodeBody: whenever the fast decoder takes an input, proto's
// decoder takes it too (metadata dropped) and decodes the same message.
func FuzzDecodeBody(f *testing.F) {
	raw, _ := proto.Marshal(bodyWithMetadata())
	f.Add(raw)
	f.Add([]byte{0x2a, 0x04, 0x0a, 0x00, 0x10, 0x01, 0x50, 0x01})
	f.Add([]byte{0x22, 0x00, 0x2a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got, want extprocv3.ProcessingRequest
		if !DecodeBodyMessage(b, &got, false) {
			return
		}
		if err := proto.Unmarshal(dropBodyMetadata(b), &want); err != nil {
			t.Fatalf("the fast decoder took what proto refuses: %v", err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("decoded %v, want %v", &got, &want)
		}
		// Aliased (fusebox's transport): the same message, its body in b,
		// and into a reused message too.
		var aliased extprocv3.ProcessingRequest
		for range 2 { // a new message, then the same one reused
			if !DecodeBodyMessage(b, &aliased, true) || !proto.Equal(&aliased, &want) {
				t.Fatalf("aliased: decoded %v, want %v", &aliased, &want)
			}
		}
		if body := aliased.GetResponseBody().GetBody(); len(body) > 0 && cap(body) != len(body) {
			t.Fatalf("an aliased body's capacity runs past it into the message: %d > %d", cap(body), len(body))
		}
	})
}

// A streamed chunk as the observer receives it, through the codec and
// through gRPC's proto codec (the baseline, same run).
func BenchmarkCodecUnmarshalChunk(b *testing.B) {
	raw, _ := proto.Marshal(bodyWithMetadata())
	for _, c := range []struct {
		name  string
		codec interface {
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"fusebox", Codec{}}, {"proto", encoding.GetCodecV2("proto")}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var m extprocv3.ProcessingRequest
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A reused message (the observer's stream) decodes each chunk in place:
// the right body each time, no allocation once its buffer is large enough.
func TestDecodeBodyMessageReuses(t *testing.T) {
	var m extprocv3.ProcessingRequest
	chunks := [][]byte{}
	for _, s := range []string{"data: {\"a\":1}\n\n", "data: [DONE]\n\n", ""} {
		b, _ := proto.Marshal(&extprocv3.ProcessingRequest{ObservabilityMode: true,
			Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(s), EndOfStream: s == ""}}})
		chunks = append(chunks, b)
		if !DecodeBodyMessage(b, &m, false) || string(m.GetResponseBody().GetBody()) != s || m.GetResponseBody().GetEndOfStream() != (s == "") || !m.ObservabilityMode {
			t.Fatalf("chunk %q decoded as %v", s, &m)
		}
	}
	if n := testing.AllocsPerRun(100, func() { DecodeBodyMessage(chunks[0], &m, false) }); n != 0 {
		t.Fatalf("%v allocations per chunk into a reused message", n)
	}
}
