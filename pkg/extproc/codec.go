package extproc

import (
	"fmt"
	"sync"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Codec is the gRPC codec of fusebox's server: gRPC's own proto codec,
// except that an ext_proc message carrying a body is decoded without its
// metadata_context. Envoy sends the forwarding namespaces' metadata with
// every message (docs/envoy.md, "Observability mode"), every chunk of a
// stream included, and decoding that map is a quarter of an observed
// message's cost; fusebox reads it only on response headers (processor/observe.go).
// mainlib installs it with grpc.ForceServerCodecV2.
type Codec struct{}

// Name is the content-subtype the codec serves: the proto one, replaced.
func (Codec) Name() string { return "proto" }

// Marshal is proto's, except for the reply to a streamed chunk (the most
// frequent message by far, shared and never modified: reply.go), whose
// encoding is made once. It was a tenth of the synchronous profile's CPU
// (pprof under bench-wire): 50 identical encodings per lifecycle.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if v == any(ResponseBodyContinue) {
		// A SliceBuffer's Free is a no-op: gRPC may share and free it.
		return mem.BufferSlice{mem.SliceBuffer(responseBodyContinueWire)}, nil
	}
	if r, ok := v.(*extprocv3.ProcessingResponse); ok {
		b, err := appendResponse(nil, r)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

var responseBodyContinueWire = func() []byte {
	b, err := proto.Marshal(ResponseBodyContinue)
	if err != nil {
		panic(err)
	}
	return b
}()

// MaxAccessLogMessage bounds one access log message (a batch of entries):
// Envoy's are a few KiB (its buffer_size_bytes flushes at 16 KiB by
// default), and one above this is refused before it is decoded. Before,
// entries up to limits.max_message_bytes (32 MiB) were decoded (RSS 449 MB
// under a flood).
const MaxAccessLogMessage = 1 << 20

// AccessLogMethod is the access log service's method, as a transport
// names it.
const AccessLogMethod = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"

// RecvBounds are the methods whose messages have a bound below
// limits.max_message_bytes. fusebox's transport checks them on a message's
// length prefix, before a byte of it is buffered
// (grpcwire.Options.MaxRecvMsgSizeFor); the codec's check stays for
// grpc-go's. Before, a 20 MiB access log message was buffered whole and
// then refused, and the refusal was not counted as message_too_large.
func RecvBounds() map[string]int { return map[string]int{AccessLogMethod: MaxAccessLogMessage} }

func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return c.UnmarshalBytes(buf.ReadOnlyData(), v)
}

// UnmarshalBytes is Unmarshal on one buffer, which it does not keep:
// fusebox's transport (grpcwire) calls it without wrapping each message
// in a mem.BufferSlice (two allocations per message).
func (Codec) UnmarshalBytes(data []byte, v any) error {
	if _, ok := v.(*accesslogv3.StreamAccessLogsMessage); ok && len(data) > MaxAccessLogMessage {
		return status.Errorf(codes.ResourceExhausted, "an access log message of %d bytes, over fusebox's bound of %d", len(data), MaxAccessLogMessage)
	}
	m, ok := v.(*extprocv3.ProcessingRequest)
	if !ok {
		pm, ok := v.(proto.Message)
		if !ok {
			return encoding.GetCodecV2("proto").Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, v)
		}
		return proto.Unmarshal(data, pm)
	}
	if DecodeBodyMessage(data, m, false) || decodeHeadersMessage(data, m) {
		return nil
	}
	sp := scratch.Get().(*[]byte)
	defer scratch.Put(sp)
	b, out := dropBodyMetadataInto(data, (*sp)[:0])
	*sp = out[:0]
	// proto copies every bytes field it decodes, so the scratch buffer
	// may be reused once Unmarshal returns.
	return proto.Unmarshal(b, m)
}

// UnmarshalBytesAliased is UnmarshalBytes, except that a body message's
// bytes point into data (grpcwire.AliasingCodec: fusebox's transport keeps
// data until the stream's next receive). No handler keeps a body past its
// message: the classifier, the sniff and the model scan copy what they
// keep, and a reply is encoded before the next receive.
func (c Codec) UnmarshalBytesAliased(data []byte, v any) (aliased bool, err error) {
	if m, ok := v.(*extprocv3.ProcessingRequest); ok && DecodeBodyMessage(data, m, true) {
		return true, nil
	}
	return false, c.UnmarshalBytes(data, v)
}

// AppendMarshal appends v's encoding to dst: Marshal without a
// mem.BufferSlice (grpcwire writes it after the message's prefix).
func (Codec) AppendMarshal(dst []byte, v any) ([]byte, error) {
	if v == any(ResponseBodyContinue) {
		return append(dst, responseBodyContinueWire...), nil
	}
	if r, ok := v.(*extprocv3.ProcessingResponse); ok {
		return appendResponse(dst, r) // its dynamic metadata by hand (codec_struct.go)
	}
	pm, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("extproc.Codec: %T is not a proto message", v)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

// scratch holds the buffers filtered messages are written to.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// The ProcessingRequest fields the codec looks at, by their numbers in
// the generated descriptor (not written by hand).
var (
	reqFields            = (&extprocv3.ProcessingRequest{}).ProtoReflect().Descriptor().Fields()
	fieldRequestBody     = reqFields.ByName("request_body").Number()
	fieldResponseBody    = reqFields.ByName("response_body").Number()
	fieldMetadataContext = reqFields.ByName("metadata_context").Number()
	requestOneof         = reqFields.ByName("request_body").ContainingOneof()
)

func inRequestOneof(num protowire.Number) bool {
	f := reqFields.ByNumber(num)
	return f != nil && f.ContainingOneof() == requestOneof
}

// dropBodyMetadata returns b without its metadata_context fields when b is
// a body message; anything else (or anything it cannot read: proto's own
// decoder then says why) is returned as it is.
func dropBodyMetadata(b []byte) []byte {
	out, _ := dropBodyMetadataInto(b, nil)
	return out
}

// dropBodyMetadataInto is dropBodyMetadata writing a filtered message into
// dst (grown as needed); it returns the message to decode and dst.
func dropBodyMetadataInto(b, dst []byte) ([]byte, []byte) {
	// The request oneof's last field wins, as in proto's decoder.
	body, meta := false, false
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return b, dst
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return b, dst
		}
		// Only a length-delimited field is the message itself; another
		// wire type under its number is an unknown field to proto.
		switch {
		case typ != protowire.BytesType:
		case num == fieldRequestBody || num == fieldResponseBody:
			body = true
		case num == fieldMetadataContext:
			meta = true
		case inRequestOneof(num):
			body = false // a later member of the oneof replaces the body
		}
		rest = rest[n+m:]
	}
	if !body || !meta {
		return b, dst
	}
	out := dst
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if num != fieldMetadataContext || typ != protowire.BytesType {
			out = append(out, rest[:n+m]...)
		}
		rest = rest[n+m:]
	}
	return out, out
}
