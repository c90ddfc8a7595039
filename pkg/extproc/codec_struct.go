package extproc

import (
	"math"
	"unicode/utf8"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The reply's dynamic_metadata is a google.protobuf.Struct, maps all the
// way down, and proto's marshaller reads maps through reflection: copying
// every key out of its map to size it, again to write it (pprof under make
// bench-wire: the marshal was a twentieth of the observer's CPU, most of
// it these maps). A reply is written as proto writes everything else in it,
// followed by its dynamic_metadata written here: a message's fields may
// come in any order on the wire. FuzzAppendStruct holds the encoding to
// proto's reading of it.

var fieldDynamicMetadata = (&extprocv3.ProcessingResponse{}).ProtoReflect().Descriptor().Fields().ByName("dynamic_metadata").Number()

// appendResponse appends r's encoding to dst, its dynamic metadata written
// by appendStruct. r is the caller's alone while it runs (its field is
// taken out and put back); a reply is, from its building to its send.
func appendResponse(dst []byte, r *extprocv3.ProcessingResponse) ([]byte, error) {
	dm := r.DynamicMetadata
	if dm == nil || !encodableStruct(dm, 0) {
		return proto.MarshalOptions{}.MarshalAppend(dst, r)
	}
	r.DynamicMetadata = nil
	b, err := proto.MarshalOptions{}.MarshalAppend(dst, r)
	r.DynamicMetadata = dm
	if err != nil {
		return nil, err
	}
	b = protowire.AppendTag(b, fieldDynamicMetadata, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeStruct(dm)))
	return appendStruct(b, dm), nil
}

// encodableStruct reports whether appendStruct writes s as proto would:
// every string valid UTF-8 (proto refuses others, and says why), no list
// holding a nil value (proto refuses it), no unknown fields (proto keeps
// them; fusebox's own metadata has none), not deeper than maxStructDepth.
func encodableStruct(s *structpb.Struct, depth int) bool {
	if depth > maxStructDepth || (s != nil && len(s.ProtoReflect().GetUnknown()) > 0) {
		return false
	}
	for k, v := range s.GetFields() {
		if !utf8.ValidString(k) || !encodableValue(v, depth) {
			return false
		}
	}
	return true
}

func encodableValue(v *structpb.Value, depth int) bool {
	if v != nil && len(v.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return utf8.ValidString(k.StringValue)
	case *structpb.Value_StructValue:
		return encodableStruct(k.StructValue, depth+1)
	case *structpb.Value_ListValue:
		if l := k.ListValue; l != nil && len(l.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		for _, e := range k.ListValue.GetValues() {
			if e == nil || !encodableValue(e, depth+1) {
				return false
			}
		}
	}
	return true
}

// The numbers of Struct, Value and ListValue's fields are the decoder's
// (codec_headers.go); a map entry's key is 1, its value 2.

func sizeStruct(s *structpb.Struct) int {
	n := 0
	for k, v := range s.GetFields() {
		e := sizeEntry(k, v)
		n += protowire.SizeTag(fieldStructFields) + protowire.SizeBytes(e)
	}
	return n
}

func sizeEntry(k string, v *structpb.Value) int {
	return protowire.SizeTag(mapEntryKey) + protowire.SizeBytes(len(k)) +
		protowire.SizeTag(mapEntryVa) + protowire.SizeBytes(sizeValue(v))
}

func sizeValue(v *structpb.Value) int {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return protowire.SizeTag(fieldValueNull) + protowire.SizeVarint(uint64(int64(k.NullValue)))
	case *structpb.Value_NumberValue:
		return protowire.SizeTag(fieldValueNumber) + protowire.SizeFixed64()
	case *structpb.Value_StringValue:
		return protowire.SizeTag(fieldValueString) + protowire.SizeBytes(len(k.StringValue))
	case *structpb.Value_BoolValue:
		return protowire.SizeTag(fieldValueBool) + protowire.SizeVarint(protowire.EncodeBool(k.BoolValue))
	case *structpb.Value_StructValue:
		return protowire.SizeTag(fieldValueStruct) + protowire.SizeBytes(sizeStruct(k.StructValue))
	case *structpb.Value_ListValue:
		return protowire.SizeTag(fieldValueList) + protowire.SizeBytes(sizeList(k.ListValue))
	}
	return 0
}

func sizeList(l *structpb.ListValue) int {
	n := 0
	for _, v := range l.GetValues() {
		n += protowire.SizeTag(fieldListValues) + protowire.SizeBytes(sizeValue(v))
	}
	return n
}

// appendStruct appends s's fields (its encoding without a tag or length).
func appendStruct(b []byte, s *structpb.Struct) []byte {
	for k, v := range s.GetFields() {
		b = protowire.AppendTag(b, fieldStructFields, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeEntry(k, v)))
		b = protowire.AppendTag(b, mapEntryKey, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, mapEntryVa, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeValue(v)))
		b = appendValue(b, v)
	}
	return b
}

func appendValue(b []byte, v *structpb.Value) []byte {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		b = protowire.AppendTag(b, fieldValueNull, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(k.NullValue)))
	case *structpb.Value_NumberValue:
		b = protowire.AppendTag(b, fieldValueNumber, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(k.NumberValue))
	case *structpb.Value_StringValue:
		b = protowire.AppendTag(b, fieldValueString, protowire.BytesType)
		b = protowire.AppendString(b, k.StringValue)
	case *structpb.Value_BoolValue:
		b = protowire.AppendTag(b, fieldValueBool, protowire.VarintType)
		b = protowire.AppendVarint(b, protowire.EncodeBool(k.BoolValue))
	case *structpb.Value_StructValue:
		b = protowire.AppendTag(b, fieldValueStruct, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeStruct(k.StructValue)))
		b = appendStruct(b, k.StructValue)
	case *structpb.Value_ListValue:
		b = protowire.AppendTag(b, fieldValueList, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeList(k.ListValue)))
		for _, e := range k.ListValue.GetValues() {
			b = protowire.AppendTag(b, fieldListValues, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(sizeValue(e)))
			b = appendValue(b, e)
		}
	}
	return b
}
