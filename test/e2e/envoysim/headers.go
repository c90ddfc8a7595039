package envoysim

import (
	"errors"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// headers is an ordered header list with lower-case keys, pseudo headers
// included, as Envoy keeps them.
type headers []kv

type kv struct{ k, v string }

func (h headers) get(k string) (string, bool) {
	for _, x := range h {
		if x.k == k {
			return x.v, true
		}
	}
	return "", false
}

func (h *headers) set(k, v string) {
	for i := range *h {
		if (*h)[i].k == k {
			(*h)[i].v = v
			// drop later duplicates: overwrite means one value
			rest := (*h)[i+1:]
			out := (*h)[:i+1]
			for _, x := range rest {
				if x.k != k {
					out = append(out, x)
				}
			}
			*h = out
			return
		}
	}
	*h = append(*h, kv{k, v})
}

func (h *headers) add(k, v string) { *h = append(*h, kv{k, v}) }

func (h *headers) del(k string) {
	out := (*h)[:0]
	for _, x := range *h {
		if x.k != k {
			out = append(out, x)
		}
	}
	*h = out
}

func (h *headers) delPrefix(p string) {
	out := (*h)[:0]
	for _, x := range *h {
		if !strings.HasPrefix(x.k, p) {
			out = append(out, x)
		}
	}
	*h = out
}

// proto renders the list as Envoy sends it: raw_value only, value empty.
func (h headers) proto() *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, x := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: x.k, RawValue: []byte(x.v)})
	}
	return m
}

// errMutation fails the request with 500 whatever failure_mode_allow says.
var errMutation = errors.New("invalid header mutation")

func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if i == 0 && c == ':' {
			continue
		}
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// mutable reports whether Envoy's default mutation rules let a processor
// set (or remove) k: host, :authority, :method and :scheme are silently
// kept, x-envoy-* cannot be changed, other pseudo headers can be changed
// only when they are :path (request) or :status (response); pseudo headers
// and host can never be removed.
func mutable(k string, remove, response, allowEnvoy bool) bool {
	switch {
	case strings.HasPrefix(k, "x-envoy-"):
		return allowEnvoy
	case k == "host" || k == ":authority" || k == ":method" || k == ":scheme":
		return false
	case strings.HasPrefix(k, ":"):
		if remove {
			return false
		}
		return (!response && k == ":path") || (response && k == ":status")
	}
	return true
}

// applyMutation applies a header mutation as Envoy's mutation_utils does:
// only raw_value is read (value alone writes an empty header; both set is
// an error), append_action is ignored and only the old append flag counts
// (default false: overwrite). Disallowed changes are skipped and counted.
// The rules are the route role's filter's (mutation_rules.allow_envoy).
func (p *Proxy) applyMutation(h *headers, m *extprocv3.HeaderMutation, response bool) error {
	return p.applyMutationRules(h, m, response, p.cfg.ExtProc.AllowEnvoy)
}

// applyMutationRules is applyMutation under one filter's allow_envoy.
func (p *Proxy) applyMutationRules(h *headers, m *extprocv3.HeaderMutation, response, allowEnvoy bool) error {
	if m == nil {
		return nil
	}
	count, kb := p.headerLimits(response)
	if len(m.RemoveHeaders) > count || len(m.SetHeaders) > count {
		p.stats.add("rejected_header_mutations")
		return errMutation
	}
	// Removes first, then sets (mutation_utils.cc applyHeaderMutations):
	// a reply that removes and sets one header leaves it set.
	for _, k := range m.RemoveHeaders {
		k = strings.ToLower(k)
		if !validName(k) {
			return errMutation
		}
		if !mutable(k, true, response, allowEnvoy) {
			p.stats.add("rejected_header_mutations")
			continue
		}
		h.del(k)
	}
	for _, opt := range m.SetHeaders {
		hv := opt.GetHeader()
		if hv == nil {
			continue
		}
		k := strings.ToLower(hv.Key)
		if hv.Value != "" && len(hv.RawValue) > 0 {
			return errMutation
		}
		v := string(hv.RawValue)
		if !validName(k) || !validValue(v) {
			return errMutation
		}
		if !mutable(k, false, response, allowEnvoy) {
			p.stats.add("rejected_header_mutations")
			continue
		}
		//lint:ignore SA1019 Envoy's ext_proc reads only the deprecated append flag (docs/ext_proc.md)
		if opt.Append != nil && opt.Append.Value {
			h.add(k, v)
		} else {
			h.set(k, v)
		}
	}
	// The headers the mutation left must fit the limits
	// (headerMutationResultCheck).
	if len(*h) > count || h.byteSize() > kb*1024 {
		p.stats.add("rejected_header_mutations")
		return errMutation
	}
	return nil
}
