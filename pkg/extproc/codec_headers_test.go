package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func benchHeaderMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// The two headers messages of an observed lifecycle as Envoy sends them
// (make bench-wire's): the route role's request headers, the observer's
// response headers with the forwarded note and the response attributes.
func headersMessages() map[string]*extprocv3.ProcessingRequest {
	note := make([]byte, 200)
	for i := range note {
		note[i] = 'a' + byte(i%26)
	}
	return map[string]*extprocv3.ProcessingRequest{
		"request": {
			ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_STREAMED},
			MetadataContext: &corev3.Metadata{},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: benchHeaderMap(
				":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw.local", ":scheme", "https",
				"content-type", "application/json", "x-request-id", "0f7c", "x-forwarded-proto", "https",
				"x-fusebox-gateway", "default", "user-agent", "wirebench")}},
		},
		"observed-response": {
			ObservabilityMode: true,
			Request:           &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: benchHeaderMap(":status", "200", "content-type", "text/event-stream")}},
			Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
				"response.flags": structpb.NewNumberValue(0), "response.code_details": structpb.NewStringValue("via_upstream")}}},
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"fusebox.observe": {Fields: map[string]*structpb.Value{
				"note": structpb.NewStringValue(string(note))}}}},
		},
	}
}

func BenchmarkCodecUnmarshalHeaders(b *testing.B) {
	for name, m := range headersMessages() {
		raw, err := proto.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for i := 0; i < b.N; i++ {
				var m extprocv3.ProcessingRequest
				if err := (Codec{}).UnmarshalBytes(raw, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The hand decoder reads what proto reads, or declines: for every input
// it takes, proto's decoder takes it too and gives an equal message; and
// what it decoded does not change when the input's buffer is reused (the
// transport's is).
func FuzzDecodeHeaders(f *testing.F) {
	for _, m := range headersMessages() {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "k", Value: "v"}, {Key: "", RawValue: []byte{0xff}}}}}}},
		//lint:ignore SA1019 the deprecated field is one the decoder must decline
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Attributes: map[string]*structpb.Struct{"a": {}}}}},
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"ns": {Fields: map[string]*structpb.Value{
				"n": structpb.NewNullValue(), "b": structpb.NewBoolValue(true), "l": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(1.5), structpb.NewStringValue("x")}}),
				"s": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"deep": {}}})}}}},
			Attributes: map[string]*structpb.Struct{"": {}, "x": {Fields: map[string]*structpb.Value{"": structpb.NewStringValue("")}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}")}}},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	// A repeated oneof member, and an invalid UTF-8 key, by hand.
	h, _ := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}})
	f.Add(append(append([]byte{}, h...), h...))
	f.Add([]byte{0x12, 0x08, 0x0a, 0x06, 0x0a, 0x04, 0x0a, 0x02, 0xc3, 0x28})
	f.Fuzz(func(t *testing.T, b []byte) {
		var got extprocv3.ProcessingRequest
		buf := append([]byte(nil), b...)
		if !decodeHeadersMessage(buf, &got) {
			return
		}
		var want extprocv3.ProcessingRequest
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatalf("the hand decoder took what proto refuses: %v", err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("decoded %v, want %v", &got, &want)
		}
		for i := range buf {
			buf[i] ^= 0xff
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("the decoded message changed with its input's buffer: %v", &got)
		}
	})
}

// Both headers messages of a lifecycle are read by the hand decoder (not
// left to proto), into the message proto would make.
func TestDecodeHeadersTakesEnvoysShapes(t *testing.T) {
	for name, m := range headersMessages() {
		b, _ := proto.Marshal(m)
		var got extprocv3.ProcessingRequest
		if !decodeHeadersMessage(b, &got) {
			t.Fatalf("%s: declined", name)
		}
		if !proto.Equal(&got, m) {
			t.Fatalf("%s: decoded %v, want %v", name, &got, m)
		}
	}
}
