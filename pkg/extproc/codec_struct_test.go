package extproc

import (
	"math"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// A reply with dynamic metadata as the route role writes it: the decision
// in the fusebox namespace, the observer's note in its own.
func replyWithMetadata() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"fusebox": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"decision": structpb.NewStringValue("d-1"), "route": structpb.NewStringValue("openai:us:gpt"),
				"attempt": structpb.NewNumberValue(1), "probe": structpb.NewBoolValue(false), "none": structpb.NewNullValue(),
				"list": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewNumberValue(math.Inf(-1)), {}}}),
			}}),
			"fusebox.observe": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"note": structpb.NewStringValue("o2...")}}),
		}},
	}
}

// The reply written with its metadata by hand reads back as proto's own
// writing of it does, and the reply is left as it was.
func TestAppendResponseIsProtos(t *testing.T) {
	for _, r := range []*extprocv3.ProcessingResponse{
		replyWithMetadata(),
		{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		{DynamicMetadata: &structpb.Struct{}},
		{DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"bad": structpb.NewStringValue("\xff")}}}, // proto's error
	} {
		before := proto.Clone(r)
		got, gotErr := appendResponse(nil, r)
		want, wantErr := proto.Marshal(r)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("error %v, proto's %v", gotErr, wantErr)
		}
		if !proto.Equal(r, before) {
			t.Fatalf("the reply changed: %v", r)
		}
		if gotErr != nil {
			continue
		}
		var a, b extprocv3.ProcessingResponse
		if err := proto.Unmarshal(got, &a); err != nil {
			t.Fatal(err)
		}
		if err := proto.Unmarshal(want, &b); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&a, &b) {
			t.Fatalf("read back %v, want %v", &a, &b)
		}
	}
}

// Any Struct proto reads (from fuzzed bytes) is written by hand as proto
// writes it, as read back; or declined to proto (it then errs too).
func FuzzAppendStruct(f *testing.F) {
	b, _ := proto.Marshal(replyWithMetadata().DynamicMetadata)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		var s structpb.Struct
		if proto.Unmarshal(in, &s) != nil {
			return
		}
		r := &extprocv3.ProcessingResponse{DynamicMetadata: &s}
		got, err := appendResponse(nil, r)
		want, wantErr := proto.Marshal(r)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("error %v, proto's %v", err, wantErr)
		}
		if err != nil {
			return
		}
		var a, w extprocv3.ProcessingResponse
		if err := proto.Unmarshal(got, &a); err != nil {
			t.Fatalf("proto cannot read the hand encoding: %v", err)
		}
		_ = proto.Unmarshal(want, &w)
		if !proto.Equal(&a, &w) {
			t.Fatalf("read back %v, want %v", &a, &w)
		}
	})
}

func BenchmarkAppendResponse(b *testing.B) {
	r := replyWithMetadata()
	for _, c := range []struct {
		name string
		f    func([]byte) ([]byte, error)
	}{
		{"fusebox", func(dst []byte) ([]byte, error) { return appendResponse(dst, r) }},
		{"proto", func(dst []byte) ([]byte, error) { return proto.MarshalOptions{}.MarshalAppend(dst, r) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 1024)
			for i := 0; i < b.N; i++ {
				if _, err := c.f(buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
