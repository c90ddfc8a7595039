package processor

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
			MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{observeNS: {Fields: map[string]*structpb.Value{
				observeKey: structpb.NewStringValue(string(note))}}}},
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
