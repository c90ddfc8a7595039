package extproc

import (
	"bytes"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func bodyWithMetadata() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:           &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: x\n\n")}},
		ObservabilityMode: true,
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"fusebox.observe": {Fields: map[string]*structpb.Value{"note": structpb.NewStringValue("note")}}}},
	}
}

// The codec decodes a body message without its metadata_context, and
// every other message (response headers above all: the observer reads the
// metadata there) exactly as gRPC's proto codec does.
func TestCodecDropsMetadataFromBodiesOnly(t *testing.T) {
	headers := bodyWithMetadata()
	headers.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}
	for _, c := range []struct {
		name     string
		in       *extprocv3.ProcessingRequest
		metadata bool
	}{{"response body", bodyWithMetadata(), false}, {"response headers", headers, true}} {
		raw, err := proto.Marshal(c.in)
		if err != nil {
			t.Fatal(err)
		}
		var got extprocv3.ProcessingRequest
		if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &got); err != nil {
			t.Fatal(err)
		}
		want := proto.Clone(c.in).(*extprocv3.ProcessingRequest)
		if !c.metadata {
			want.MetadataContext = nil
		}
		if !proto.Equal(&got, want) {
			t.Fatalf("%s: decoded %v, want %v", c.name, &got, want)
		}
	}
}

// FuzzDropBodyMetadata: for any input, decoding the filtered bytes agrees
// with proto's decoder on the original, metadata_context aside (R-L*: a
// parser of Envoy's input).
func FuzzDropBodyMetadata(f *testing.F) {
	raw, _ := proto.Marshal(bodyWithMetadata())
	f.Add(raw)
	f.Add([]byte{0x42, 0x00, 0x22, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var orig, got extprocv3.ProcessingRequest
		errOrig := proto.Unmarshal(b, &orig)
		errGot := proto.Unmarshal(dropBodyMetadata(b), &got)
		if errOrig != nil {
			return // proto refuses it; whatever the filter gives is refused or smaller
		}
		if errGot != nil {
			t.Fatalf("a valid message no longer decodes: %v", errGot)
		}
		if orig.GetRequestBody() != nil || orig.GetResponseBody() != nil {
			orig.MetadataContext = nil
		}
		if got.GetRequestBody() != nil || got.GetResponseBody() != nil {
			got.MetadataContext = nil
		}
		if !proto.Equal(&orig, &got) {
			t.Fatalf("decoded %v, want %v", &got, &orig)
		}
	})
}

// The oneof's last member wins: a body followed by response headers is a
// headers message, and keeps its metadata.
func TestCodecLastOneofMemberWins(t *testing.T) {
	body, _ := proto.Marshal(bodyWithMetadata())
	h, _ := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}})
	b := append(body, h...)
	var orig, got extprocv3.ProcessingRequest
	if err := proto.Unmarshal(b, &orig); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(dropBodyMetadata(b), &got); err != nil || !proto.Equal(&orig, &got) {
		t.Fatalf("decoded %v, want %v (%v)", &got, &orig, err)
	}
}

// The chunk reply's cached encoding is proto's own.
func TestCodecChunkReplyEncoding(t *testing.T) {
	got, err := (Codec{}).Marshal(ResponseBodyContinue)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(ResponseBodyContinue)
	var back extprocv3.ProcessingResponse
	if string(got.Materialize()) != string(want) || proto.Unmarshal(got.Materialize(), &back) != nil || back.GetResponseBody() == nil {
		t.Fatalf("encoded %x, want %x", got.Materialize(), want)
	}
}

// AppendMarshal writes what Marshal writes, after what dst holds, for the
// shared chunk reply and any other message; UnmarshalBytes reads what
// Unmarshal reads.
func TestCodecBytesPathIsMarshal(t *testing.T) {
	for _, m := range []proto.Message{ResponseBodyContinue, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}} {
		want, err := Codec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Codec{}.AppendMarshal([]byte("abcde"), m)
		if err != nil || string(got[:5]) != "abcde" || !bytes.Equal(got[5:], want.Materialize()) {
			t.Fatalf("%T: AppendMarshal %q, Marshal %q (%v)", m, got, want.Materialize(), err)
		}
	}
	in := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}
	b, _ := proto.Marshal(in)
	var a, c extprocv3.ProcessingRequest
	if err := (Codec{}).UnmarshalBytes(b, &a); err != nil {
		t.Fatal(err)
	}
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &c); err != nil || !proto.Equal(&a, &c) || !proto.Equal(&a, in) {
		t.Fatalf("UnmarshalBytes %v, Unmarshal %v (%v)", &a, &c, err)
	}
}
