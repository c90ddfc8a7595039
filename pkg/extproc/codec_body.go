package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// The fields of the body messages the fast decoder reads, by their numbers
// in the generated descriptors.
var (
	fieldObservabilityMode = reqFields.ByName("observability_mode").Number()
	bodyFields             = (&extprocv3.HttpBody{}).ProtoReflect().Descriptor().Fields()
	fieldBodyBytes         = bodyFields.ByName("body").Number()
	fieldBodyEnd           = bodyFields.ByName("end_of_stream").Number()
)

// decodeBodyMessage decodes b into m when b is the plain shape of a
// streamed body message: one request_body or response_body holding only
// body and end_of_stream, perhaps observability_mode, perhaps the
// metadata_context Envoy repeats (dropped, as dropBodyMetadata does).
// It reports false, m untouched, for anything else, which proto's decoder
// then reads. Fifty of a lifecycle's 53 messages have this shape, and
// proto's table-driven decoder was a fifth of the observer's CPU (pprof,
// BenchmarkObserverProfile): this one reads them without reflection. A
// differential fuzz target holds it to proto's result (FuzzDecodeBody).
//
// With alias the body points into b (Codec.UnmarshalBytesAliased), else
// it is a copy.
func DecodeBodyMessage(b []byte, m *extprocv3.ProcessingRequest, alias bool) bool {
	var (
		which      protowire.Number
		inner      []byte
		observable bool
	)
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return false
		}
		rest = rest[n:]
		switch {
		case typ == protowire.BytesType && (num == fieldRequestBody || num == fieldResponseBody):
			if which != 0 {
				return false // a repeated or replaced oneof: proto merges
			}
			v, k := protowire.ConsumeBytes(rest)
			if k < 0 {
				return false
			}
			which, inner, rest = num, v, rest[k:]
		case typ == protowire.BytesType && num == fieldMetadataContext:
			_, k := protowire.ConsumeBytes(rest)
			if k < 0 {
				return false
			}
			rest = rest[k:]
		case typ == protowire.VarintType && num == fieldObservabilityMode:
			v, k := protowire.ConsumeVarint(rest)
			if k < 0 {
				return false
			}
			observable, rest = protowire.DecodeBool(v), rest[k:]
		default:
			return false
		}
	}
	if which == 0 {
		return false
	}
	var (
		body    []byte
		hasBody bool
		end     bool
	)
	for rest := inner; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return false
		}
		rest = rest[n:]
		switch {
		case typ == protowire.BytesType && num == fieldBodyBytes:
			v, k := protowire.ConsumeBytes(rest)
			if k < 0 {
				return false
			}
			body, hasBody, rest = v, true, rest[k:]
		case typ == protowire.VarintType && num == fieldBodyEnd:
			v, k := protowire.ConsumeVarint(rest)
			if k < 0 {
				return false
			}
			end, rest = protowire.DecodeBool(v), rest[k:]
		default:
			return false
		}
	}
	// A message the observer's stream reuses (server.go) keeps its
	// response body's wrapper and buffer: nothing holds them once the
	// message is handled (the classifier and the sniff copy what they
	// keep).
	if rb, ok := m.Request.(*extprocv3.ProcessingRequest_ResponseBody); ok && which == fieldResponseBody && rb.ResponseBody != nil {
		hb := rb.ResponseBody
		buf := hb.Body[:0]
		if alias {
			buf = nil // b's, not this message's: not to be written
		}
		m.Reset()
		hb.Reset()
		switch {
		case hasBody && alias:
			hb.Body = body[:len(body):len(body)]
		case hasBody:
			hb.Body = append(buf, body...)
		}
		hb.EndOfStream = end
		rb.ResponseBody = hb
		m.ObservabilityMode, m.Request = observable, rb
		return true
	}
	hb := &extprocv3.HttpBody{EndOfStream: end}
	switch {
	case hasBody && alias:
		hb.Body = body[:len(body):len(body)]
	case hasBody:
		// A copy: gRPC reuses the buffer b lives in.
		hb.Body = append(make([]byte, 0, len(body)), body...)
	}
	m.Reset()
	m.ObservabilityMode = observable
	if which == fieldResponseBody {
		m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}
	} else {
		m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}
	}
	return true
}
