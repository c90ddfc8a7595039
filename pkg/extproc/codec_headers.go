package extproc

import (
	"math"
	"unicode/utf8"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
)

// decodeHeadersMessage decodes b into m when b is the shape of a headers
// message as Envoy sends it: request_headers or response_headers holding
// a header map and end_of_stream, with any of metadata_context (its
// filter_metadata), attributes, observability_mode and protocol_config.
// It reports false, m untouched, for anything else (a repeated singular
// field, an unknown field, a string that is not UTF-8, ...), which proto's
// decoder then reads or refuses. Proto's reflective decoder on the two
// headers messages of a lifecycle was a twentieth of the observer's CPU
// and two thirds of its allocations (pprof under make bench-wire): this one
// copies the message once, takes the names (header keys, map keys) and the
// raw header values from that copy, and the header values from one slice;
// a string value, which may be kept, is a copy of its own. A differential
// fuzz target holds it to proto's result (FuzzDecodeHeaders).
func decodeHeadersMessage(b []byte, m *extprocv3.ProcessingRequest) bool {
	d := headersDecoder{own: append(make([]byte, 0, len(b)), b...)}
	var (
		out  extprocv3.ProcessingRequest
		seen uint64 // the fields seen, by number: a repeat is left to proto
	)
	for rest := d.own; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || num >= 64 || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		rest = rest[k:]
		switch {
		case typ == protowire.BytesType && (num == fieldRequestHeaders || num == fieldResponseHeaders):
			if seen&(1<<fieldRequestHeaders) != 0 && seen&(1<<fieldResponseHeaders) != 0 {
				return false // two members of the oneof
			}
			h, ok := d.httpHeaders(v)
			if !ok {
				return false
			}
			if num == fieldRequestHeaders {
				out.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}
			} else {
				out.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h}
			}
		case typ == protowire.BytesType && num == fieldMetadataContext:
			md, ok := d.metadata(v)
			if !ok {
				return false
			}
			out.MetadataContext = md
		case typ == protowire.BytesType && num == fieldAttributes:
			// A map's entries are each a field of their own: repeats are
			// entries, the last one of a key wins.
			seen &^= 1 << num
			if out.Attributes == nil {
				out.Attributes = map[string]*structpb.Struct{}
			}
			if !d.structEntry(v, out.Attributes) {
				return false
			}
		case typ == protowire.VarintType && num == fieldObservabilityMode:
			out.ObservabilityMode = protowire.DecodeBool(d.varint)
		case typ == protowire.BytesType && num == fieldProtocolConfig:
			pc, ok := d.protocolConfig(v)
			if !ok {
				return false
			}
			out.ProtocolConfig = pc
		default:
			return false
		}
	}
	if out.Request == nil {
		return false
	}
	m.Reset()
	m.Request, m.MetadataContext, m.Attributes, m.ObservabilityMode, m.ProtocolConfig =
		out.Request, out.MetadataContext, out.Attributes, out.ObservabilityMode, out.ProtocolConfig
	return true
}

// The fields the headers decoder reads, by their numbers in the generated
// descriptors (not written by hand).
var (
	fieldRequestHeaders  = reqFields.ByName("request_headers").Number()
	fieldResponseHeaders = reqFields.ByName("response_headers").Number()
	fieldAttributes      = reqFields.ByName("attributes").Number()
	fieldProtocolConfig  = reqFields.ByName("protocol_config").Number()

	httpHeadersFields = (&extprocv3.HttpHeaders{}).ProtoReflect().Descriptor().Fields()
	fieldHTTPHeaders  = httpHeadersFields.ByName("headers").Number()
	fieldHTTPEnd      = httpHeadersFields.ByName("end_of_stream").Number()

	fieldHeaderMapHeaders = (&corev3.HeaderMap{}).ProtoReflect().Descriptor().Fields().ByName("headers").Number()
	headerValueFields     = (&corev3.HeaderValue{}).ProtoReflect().Descriptor().Fields()
	fieldHeaderKey        = headerValueFields.ByName("key").Number()
	fieldHeaderValue      = headerValueFields.ByName("value").Number()
	fieldHeaderRaw        = headerValueFields.ByName("raw_value").Number()

	fieldFilterMetadata = (&corev3.Metadata{}).ProtoReflect().Descriptor().Fields().ByName("filter_metadata").Number()

	protocolFields          = (&extprocv3.ProtocolConfiguration{}).ProtoReflect().Descriptor().Fields()
	fieldRequestBodyMode    = protocolFields.ByName("request_body_mode").Number()
	fieldResponseBodyMode   = protocolFields.ByName("response_body_mode").Number()
	fieldSendBodyNoWait     = protocolFields.ByName("send_body_without_waiting_for_header_response").Number()
	fieldStructFields       = (&structpb.Struct{}).ProtoReflect().Descriptor().Fields().ByName("fields").Number()
	valueFields             = (&structpb.Value{}).ProtoReflect().Descriptor().Fields()
	fieldValueNull          = valueFields.ByName("null_value").Number()
	fieldValueNumber        = valueFields.ByName("number_value").Number()
	fieldValueString        = valueFields.ByName("string_value").Number()
	fieldValueBool          = valueFields.ByName("bool_value").Number()
	fieldValueStruct        = valueFields.ByName("struct_value").Number()
	fieldValueList          = valueFields.ByName("list_value").Number()
	fieldListValues         = (&structpb.ListValue{}).ProtoReflect().Descriptor().Fields().ByName("values").Number()
	mapEntryKey, mapEntryVa = protoreflect.FieldNumber(1), protoreflect.FieldNumber(2) // every map entry's (the proto spec)
)

// headersDecoder reads one message from own, its private copy: every
// string and byte field it returns points into own, which nothing writes.
type headersDecoder struct {
	own []byte
	// varint and fixed are the value of the last varint or fixed64 field
	// read.
	varint uint64
	fixed  uint64
	// depth bounds the nesting of struct values (proto's own limit).
	depth int
}

// field reads one field of rest: its number and wire type, a bytes
// field's value, and the field's length (< 0: malformed).
func (d *headersDecoder) field(rest []byte) (protowire.Number, protowire.Type, []byte, int) {
	num, typ, n := protowire.ConsumeTag(rest)
	if n < 0 {
		return 0, 0, nil, -1
	}
	switch typ {
	case protowire.BytesType:
		v, k := protowire.ConsumeBytes(rest[n:])
		if k < 0 {
			return 0, 0, nil, -1
		}
		return num, typ, v[:len(v):len(v)], n + k
	case protowire.VarintType:
		v, k := protowire.ConsumeVarint(rest[n:])
		if k < 0 {
			return 0, 0, nil, -1
		}
		d.varint = v
		return num, typ, nil, n + k
	case protowire.Fixed64Type:
		v, k := protowire.ConsumeFixed64(rest[n:])
		if k < 0 {
			return 0, 0, nil, -1
		}
		d.fixed = v
		return num, typ, nil, n + k
	}
	return 0, 0, nil, -1 // other wire types are no field of these messages
}

// str is b as a string without a copy: b is in d.own. proto3 strings are
// UTF-8; proto refuses one that is not, so this decoder leaves it to it.
// Only for names (a header's, a map's keys), which nothing keeps past the
// message: a kept string would keep the whole copy alive.
func str(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		return "", false
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), true
}

// strCopy is str for a value, which may be kept (a response's code
// details go into its outcome): its own copy.
func strCopy(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

func (d *headersDecoder) httpHeaders(b []byte) (*extprocv3.HttpHeaders, bool) {
	h := &extprocv3.HttpHeaders{}
	var seen uint64
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || num >= 64 || seen&(1<<num) != 0 {
			return nil, false
		}
		seen |= 1 << num
		rest = rest[k:]
		switch {
		case typ == protowire.BytesType && num == fieldHTTPHeaders:
			hm, ok := d.headerMap(v)
			if !ok {
				return nil, false
			}
			h.Headers = hm
		case typ == protowire.VarintType && num == fieldHTTPEnd:
			h.EndOfStream = protowire.DecodeBool(d.varint)
		default:
			return nil, false
		}
	}
	return h, true
}

func (d *headersDecoder) headerMap(b []byte) (*corev3.HeaderMap, bool) {
	n := 0
	for rest := b; len(rest) > 0; n++ {
		num, typ, _, k := d.field(rest)
		if k < 0 || num != fieldHeaderMapHeaders || typ != protowire.BytesType {
			return nil, false
		}
		rest = rest[k:]
	}
	hm := &corev3.HeaderMap{}
	if n == 0 {
		return hm, true
	}
	// One allocation for every header, and one for the pointers proto's
	// type wants.
	vals := make([]corev3.HeaderValue, n)
	hm.Headers = make([]*corev3.HeaderValue, n)
	i := 0
	for rest := b; len(rest) > 0; i++ {
		_, _, v, k := d.field(rest)
		rest = rest[k:]
		if !d.headerValue(v, &vals[i]) {
			return nil, false
		}
		hm.Headers[i] = &vals[i]
	}
	return hm, true
}

func (d *headersDecoder) headerValue(b []byte, hv *corev3.HeaderValue) bool {
	var seen uint64
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || typ != protowire.BytesType || num >= 64 || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		rest = rest[k:]
		var ok bool
		switch num {
		case fieldHeaderKey:
			hv.Key, ok = str(v)
		case fieldHeaderValue:
			hv.Value, ok = strCopy(v)
		case fieldHeaderRaw:
			hv.RawValue, ok = v, true // capped at its length: an append copies
		}
		if !ok {
			return false
		}
	}
	return true
}

func (d *headersDecoder) metadata(b []byte) (*corev3.Metadata, bool) {
	md := &corev3.Metadata{}
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || num != fieldFilterMetadata || typ != protowire.BytesType {
			return nil, false // typed_filter_metadata (an Any) is left to proto
		}
		rest = rest[k:]
		if md.FilterMetadata == nil {
			md.FilterMetadata = map[string]*structpb.Struct{}
		}
		if !d.structEntry(v, md.FilterMetadata) {
			return nil, false
		}
	}
	return md, true
}

// structEntry reads one map<string, Struct> entry into into. An entry
// without its key or its value is left to proto.
func (d *headersDecoder) structEntry(b []byte, into map[string]*structpb.Struct) bool {
	key, val, ok := d.mapEntry(b)
	if !ok {
		return false
	}
	s, ok := d.structValue(val)
	if !ok {
		return false
	}
	into[key] = s
	return true
}

// mapEntry reads a map entry with a string key and a message value.
func (d *headersDecoder) mapEntry(b []byte) (key string, val []byte, ok bool) {
	var hasKey, hasVal bool
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || typ != protowire.BytesType {
			return "", nil, false
		}
		rest = rest[k:]
		switch {
		case num == mapEntryKey && !hasKey:
			if key, ok = str(v); !ok {
				return "", nil, false
			}
			hasKey = true
		case num == mapEntryVa && !hasVal:
			val, hasVal = v, true
		default:
			return "", nil, false
		}
	}
	return key, val, hasKey && hasVal
}

// maxStructDepth bounds nested struct and list values: deeper ones are
// left to proto (whose own limit is 10,000).
const maxStructDepth = 32

func (d *headersDecoder) structValue(b []byte) (*structpb.Struct, bool) {
	if d.depth++; d.depth > maxStructDepth {
		return nil, false
	}
	defer func() { d.depth-- }()
	s := &structpb.Struct{}
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || num != fieldStructFields || typ != protowire.BytesType {
			return nil, false
		}
		rest = rest[k:]
		key, val, ok := d.mapEntry(v)
		if !ok {
			return nil, false
		}
		pv, ok := d.value(val)
		if !ok {
			return nil, false
		}
		if s.Fields == nil {
			s.Fields = map[string]*structpb.Value{}
		}
		s.Fields[key] = pv
	}
	return s, true
}

func (d *headersDecoder) value(b []byte) (*structpb.Value, bool) {
	pv := &structpb.Value{}
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || pv.Kind != nil {
			return nil, false // a second kind: proto's oneof rules decide
		}
		rest = rest[k:]
		switch {
		case typ == protowire.VarintType && num == fieldValueNull:
			pv.Kind = &structpb.Value_NullValue{NullValue: structpb.NullValue(int32(d.varint))}
		case typ == protowire.Fixed64Type && num == fieldValueNumber:
			pv.Kind = &structpb.Value_NumberValue{NumberValue: math.Float64frombits(d.fixed)}
		case typ == protowire.BytesType && num == fieldValueString:
			s, ok := strCopy(v)
			if !ok {
				return nil, false
			}
			pv.Kind = &structpb.Value_StringValue{StringValue: s}
		case typ == protowire.VarintType && num == fieldValueBool:
			pv.Kind = &structpb.Value_BoolValue{BoolValue: protowire.DecodeBool(d.varint)}
		case typ == protowire.BytesType && num == fieldValueStruct:
			s, ok := d.structValue(v)
			if !ok {
				return nil, false
			}
			pv.Kind = &structpb.Value_StructValue{StructValue: s}
		case typ == protowire.BytesType && num == fieldValueList:
			l, ok := d.listValue(v)
			if !ok {
				return nil, false
			}
			pv.Kind = &structpb.Value_ListValue{ListValue: l}
		default:
			return nil, false
		}
	}
	return pv, true
}

func (d *headersDecoder) listValue(b []byte) (*structpb.ListValue, bool) {
	if d.depth++; d.depth > maxStructDepth {
		return nil, false
	}
	defer func() { d.depth-- }()
	l := &structpb.ListValue{}
	for rest := b; len(rest) > 0; {
		num, typ, v, k := d.field(rest)
		if k < 0 || num != fieldListValues || typ != protowire.BytesType {
			return nil, false
		}
		rest = rest[k:]
		pv, ok := d.value(v)
		if !ok {
			return nil, false
		}
		l.Values = append(l.Values, pv)
	}
	return l, true
}

func (d *headersDecoder) protocolConfig(b []byte) (*extprocv3.ProtocolConfiguration, bool) {
	pc := &extprocv3.ProtocolConfiguration{}
	var seen uint64
	for rest := b; len(rest) > 0; {
		num, typ, _, k := d.field(rest)
		if k < 0 || typ != protowire.VarintType || num >= 64 || seen&(1<<num) != 0 {
			return nil, false
		}
		seen |= 1 << num
		rest = rest[k:]
		switch num {
		case fieldRequestBodyMode:
			pc.RequestBodyMode = filterv3.ProcessingMode_BodySendMode(int32(d.varint))
		case fieldResponseBodyMode:
			pc.ResponseBodyMode = filterv3.ProcessingMode_BodySendMode(int32(d.varint))
		case fieldSendBodyNoWait:
			pc.SendBodyWithoutWaitingForHeaderResponse = protowire.DecodeBool(d.varint)
		default:
			return nil, false
		}
	}
	return pc, true
}
