package processor

import (
	"encoding/json"
	"strings"
	"testing"

	prioritygroupv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/router/cluster_specifiers/priority_group/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// R-X1: with failover.max_attempts > 1 the decision carries the chain in
// Envoy's PriorityGroupsOverride shape: the dispatched route first, then
// healthy candidates in routing order, at most max_attempts groups; the
// stage names the chain. With max_attempts 1 nothing changes.
func TestFailoverChain(t *testing.T) {
	e := newFailoverEnv(t)
	chainOf := func(model string) (string, string) {
		t.Helper()
		c := e.open("")
		r := c.chat(model)
		c.end()
		md := r.GetDynamicMetadata()
		if md == nil {
			return "", ""
		}
		fo, ok := md.Fields["fusebox.failover"]
		if !ok {
			return "", ""
		}
		b, _ := json.Marshal(fo.GetStructValue().AsMap())
		return string(b), md.Fields["fusebox"].GetStructValue().Fields["chain"].GetStringValue()
	}
	js, chain := chainOf("fo")
	want := `{"priority_groups":[{"clusters":[{"cluster_name":"c_openai_us","weight":1}],"name":"openai:us:gpt"},{"clusters":[{"cluster_name":"c_azure_eu","weight":1}],"name":"azure:eu:gpt"}]}`
	if js != want || chain != "openai:us:gpt,azure:eu:gpt" {
		t.Fatalf("chain %s\nmetadata %s", chain, js)
	}
	// It is what Envoy's priority_group specifier reads from the untyped
	// namespace: a PriorityGroupsOverride.
	var override prioritygroupv3.PriorityGroupsOverride
	if err := protojson.Unmarshal([]byte(js), &override); err != nil {
		t.Fatalf("not a PriorityGroupsOverride: %v", err)
	}
	if err := override.ValidateAll(); err != nil || len(override.PriorityGroups) != 2 ||
		override.PriorityGroups[1].Clusters[0].ClusterName != "c_azure_eu" || override.PriorityGroups[0].Clusters[0].Weight.GetValue() != 1 {
		t.Fatalf("override %v (%v)", &override, err)
	}
	// An open route is left out of the chain; the next healthy one takes
	// its place.
	e.openRoute("default", "azure:eu:gpt")
	if _, chain := chainOf("fo"); chain != "openai:us:gpt,openai:eu:gpt" {
		t.Fatalf("with azure open: %q", chain)
	}
	// max_attempts 1 (the default): a chain of one group (R-X8).
	if _, chain := chainOf("cheap"); strings.Contains(chain, ",") || chain == "" {
		t.Fatalf("max_attempts 1 in the failover deployment: chain %q, want one group", chain)
	}
	// Without envoy.failover no decision carries a chain, whatever
	// max_attempts says: no attempt role would record it.
	e = newEnv(t)
	if js, _ := chainOf("fo"); js != "" {
		t.Fatalf("a chain without the failover deployment: %s", js)
	}
}
