package envoysim

import (
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Header limits after a mutation, and the order removes-then-sets
// (mutation_utils.cc applyHeaderMutations, docs/envoy/stream.md). Before,
// envoysim let a reply grow the headers past any limit and applied the
// sets before the removes.
func TestHeaderMutationLimits(t *testing.T) {
	many := func(n int, val string) []*corev3.HeaderValueOption {
		var out []*corev3.HeaderValueOption
		for i := range n {
			out = append(out, set(fmt.Sprintf("x-h%d", i), val))
		}
		return out
	}
	cases := []struct {
		name   string
		mut    *extprocv3.HeaderMutation
		mod    func(*Config)
		status int
	}{
		{"within the limits", &extprocv3.HeaderMutation{SetHeaders: many(10, "v")}, nil, 200},
		{"more sets than the count limit", &extprocv3.HeaderMutation{SetHeaders: many(101, "v")}, nil, 500},
		{"more removes than the count limit", &extprocv3.HeaderMutation{RemoveHeaders: strings.Split(strings.Repeat("x-r,", 101), ",")[:101]}, nil, 500},
		{"the result over the count limit", &extprocv3.HeaderMutation{SetHeaders: many(15, "v")},
			func(c *Config) { c.MaxHeadersCount = 20 }, 500},
		{"the result over the size limit", &extprocv3.HeaderMutation{SetHeaders: many(3, strings.Repeat("a", 700))},
			func(c *Config) { c.MaxRequestHeadersKb = 2 }, 500},
		{"the result over the default size", &extprocv3.HeaderMutation{SetHeaders: many(70, strings.Repeat("a", 1000))}, nil, 500},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mods []func(*Config)
			if tc.mod != nil {
				mods = append(mods, tc.mod)
			}
			r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if req.GetRequestHeaders() != nil {
					return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: tc.mut})
				}
				return plain(req)
			}, mods...)
			resp, _ := r.post(`{}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d, want %d", resp.StatusCode, tc.status)
			}
			if rej := r.proxy.Stats().Get("rejected_header_mutations"); (tc.status == 500) != (rej == 1) {
				t.Fatalf("rejected_header_mutations %d", rej)
			}
		})
	}
	// A reply that removes and sets one header leaves it set.
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestHeaders() != nil {
			return reqHeadersReply(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{set("x-both", "set")}, RemoveHeaders: []string{"x-both"}}})
		}
		return plain(req)
	})
	r.post(`{}`, "x-both", "client")
	if got := r.def.last.Header.Get("x-both"); got != "set" {
		t.Fatalf("x-both %q after remove and set, want set", got)
	}
}
