package plan

import (
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// mergeIndices is a and b in routing order (both sorted), each once.
func MergeIndices(a, b []int) []int {
	out := append(append(make([]int, 0, len(a)+len(b)), a...), b...)
	sort.Ints(out)
	return slices.Compact(out)
}

// chainOf is the failover chain (R-X1): the dispatched route first, then
// the other remaining candidates in routing order that are closed and
// unblocked, at most max groups.
func ChainOf(cands []*routes.Route, v []breaker.Verdict, order []int, chosenAt, max int) []int {
	idx := []int{order[chosenAt]}
	for _, i := range order[chosenAt+1:] {
		if len(idx) == max {
			break
		}
		// Only the first group may be a half-open route (its admitted
		// probe); later ones must be healthy.
		if v[i].Allowed && v[i].State == breaker.Closed {
			idx = append(idx, i)
		}
	}
	return idx
}

// withChain writes the chain idx of cands as Envoy's
// PriorityGroupsOverride in namespace fusebox.failover; the stage gains
// chain.
func WithChain(stage *structpb.Struct, action string, cands []*routes.Route, idx []int) *structpb.Struct {
	groups := make([]any, 0, len(idx))
	for _, i := range idx {
		groups = append(groups, map[string]any{
			"name":     cands[i].Key,
			"clusters": []any{map[string]any{"cluster_name": cands[i].Cluster, "weight": 1}},
		})
	}
	if stage == nil {
		stage = extproc.StageMetadata(action, "", "")
	}
	chain := Keys(cands, idx)
	stage.Fields["fusebox"].GetStructValue().Fields["chain"] = structpb.NewStringValue(chain)
	override, err := structpb.NewStruct(map[string]any{"priority_groups": groups})
	if err == nil {
		stage.Fields[FailoverNamespace] = structpb.NewStructValue(override)
	}
	return stage
}

// FailoverNamespace is the dynamic metadata namespace of the chain, read
// by Envoy's priority_group specifier (override_metadata_namespace).
const FailoverNamespace = "fusebox.failover"

func Flagged(f []bool) []int {
	var out []int
	for i, v := range f {
		if v {
			out = append(out, i)
		}
	}
	return out
}

// clusters joins the clusters of cands[order[from:]] (order nil = all).
func Clusters(cands []*routes.Route, order []int, from int) string {
	var b strings.Builder
	if order == nil {
		for i := from + 1; i < len(cands); i++ {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(cands[i].Cluster)
		}
		return b.String()
	}
	for _, idx := range order[from:] {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(cands[idx].Cluster)
	}
	return b.String()
}

func Keys(cands []*routes.Route, idx []int) string {
	var b strings.Builder
	for i, x := range idx {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(cands[x].Key)
	}
	return b.String()
}

func Unhealthy(v []breaker.Verdict) []int {
	var out []int
	for i := range v {
		if !v[i].Allowed {
			out = append(out, i)
		}
	}
	return out
}

// RampDraw maps a decision to 0..999 for route key (FNV-1a): the same
// decision always draws the same, and routes draw independently.
func RampDraw(decision, key string) uint16 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(decision); i++ {
		h ^= uint64(decision[i])
		h *= 1099511628211
	}
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return uint16(h % 1000)
}
