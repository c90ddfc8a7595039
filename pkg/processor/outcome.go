package processor

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The outcome in the access log (SPEC R-R1): when a response message
// settles the attempt's outcome, the reply to it sets fusebox.outcome and
// fusebox.reason in Envoy's dynamic metadata. Envoy takes dynamic metadata
// from the reply of every message kind, in the namespaces the filter
// receives (docs/envoy.md, "What the access log holds"), and writes the
// access log when the stream completes, after the last reply: the shipped
// access log line carries them, and extproc replay reads them back.

// withOutcome adds the recorded outcome to resp once.
func (st *stream) withOutcome(resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	if st.outcomeClass == "" || resp == nil {
		return resp
	}
	fields := map[string]*structpb.Value{
		"outcome": structpb.NewStringValue(st.outcomeClass),
		"reason":  structpb.NewStringValue(st.outcomeReason),
	}
	// The tokens the provider reported, when it did (replay's cost).
	if u := st.outcomeUsage; u.InputTokens > 0 || u.OutputTokens > 0 {
		fields["tokens_in"] = structpb.NewNumberValue(float64(u.InputTokens))
		fields["tokens_out"] = structpb.NewNumberValue(float64(u.OutputTokens))
	}
	st.outcomeClass = ""
	// Replies may be shared, prebuilt values, and their metadata with them
	// (a reply is encoded by gRPC while another stream builds its own):
	// the outcome goes on a copy, never into what resp points at.
	out := proto.Clone(resp).(*extprocv3.ProcessingResponse)
	md := out.DynamicMetadata
	if md == nil {
		md = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		out.DynamicMetadata = md
	}
	if ns := md.Fields["fusebox"].GetStructValue(); ns != nil {
		for k, v := range fields {
			ns.Fields[k] = v
		}
		return out
	}
	md.Fields["fusebox"] = structpb.NewStructValue(&structpb.Struct{Fields: fields})
	return out
}
