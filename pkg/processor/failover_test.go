package processor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	prioritygroupv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/router/cluster_specifiers/priority_group/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
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

// refusingStore admits route refuse only as the store of a replica whose
// view changed since the Peek would: refused, or (leased) with a probe
// slot, as when the route turned half-open meanwhile. It counts the
// slots given back.
type refusingStore struct {
	breaker.Store
	route    string
	leased   bool
	released atomic.Int32
}

func (s *refusingStore) Acquire(ctx context.Context, k breaker.Key, now int64, force bool) (breaker.Admission, bool, error) {
	if k.ID().Route == s.route {
		if s.leased {
			return breaker.Admission{Gen: 1, Lease: 7}, true, nil
		}
		return breaker.Admission{}, false, nil
	}
	return s.Store.Acquire(ctx, k, now, force)
}

func (s *refusingStore) Release(ctx context.Context, k breaker.Key, adm breaker.Admission) error {
	if k.ID().Route == s.route && adm.Lease == 7 {
		s.released.Add(1)
		return nil
	}
	return s.Store.Release(ctx, k, adm)
}

// A later chain group that the store refuses at decision time, or that
// comes back holding a probe slot (only the first group may), is left out
// of the chain (metadata and token alike) and its slot is given back.
// Before, it stayed in the chain and its slot was never released: the
// attempt role drops the leases of groups after the first.
func TestChainLeavesOutRefusedGroups(t *testing.T) {
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("leased %v", leased), func(t *testing.T) {
			var rs *refusingStore
			e := newFailoverEnv(t, func(o *Options) {
				rs = &refusingStore{Store: o.Store, route: "azure:eu:gpt", leased: leased}
				o.Store = rs
			})
			c := e.open("route")
			r := c.chat("fo3")
			c.end()
			chain := r.GetDynamicMetadata().GetFields()["fusebox"].GetStructValue().GetFields()["chain"].GetStringValue()
			if chain != "openai:us:gpt,openai:eu:gpt" {
				t.Fatalf("chain %q, want the refused azure left out", chain)
			}
			tok, _ := headerSet(t, common(r), AttemptHeader)
			at, err := e.srv.parseAttemptToken(tok)
			if err != nil || len(at.Chain) != 2 || at.Chain[1].Route != "openai:eu:gpt" {
				t.Fatalf("token chain %+v (%v)", at.Chain, err)
			}
			want := int32(0)
			if leased {
				want = 1
			}
			if rs.released.Load() != want {
				t.Fatalf("released %d slots, want %d", rs.released.Load(), want)
			}
		})
	}
}

// A later chain group whose fleet breaker comes back holding a probe slot
// is left out like one whose route breaker does, and the fleet's slot is
// given back (only the first group may hold a slot, R-X1).
func TestChainLeavesOutAFleetLeasedGroup(t *testing.T) {
	cfg := "envoy: {failover: true}\n" + strings.Replace(testConfig, "      - name: llama\n", "      - name: folm\n        routes: [\"self:a:llama\", \"self:b:llama\"]\n        failover: {max_attempts: 2}\n      - name: llama\n", 1)
	var rs *refusingStore
	e := newEnvConfig(t, cfg, func(o *Options) {
		rs = &refusingStore{Store: o.Store, route: "fleet:gpu", leased: true}
		o.Store = rs
	})
	c := e.open("route")
	r := c.chat("folm")
	c.end()
	chain := r.GetDynamicMetadata().GetFields()["fusebox"].GetStructValue().GetFields()["chain"].GetStringValue()
	if chain != "self:a:llama" {
		t.Fatalf("chain %q: the group whose fleet slot was leased stayed", chain)
	}
	if rs.released.Load() != 1 {
		t.Fatalf("released %d fleet slots, want 1", rs.released.Load())
	}
}
