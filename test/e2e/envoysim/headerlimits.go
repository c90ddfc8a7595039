package envoysim

// Header limits after a mutation (mutation_utils.cc, every release fusebox
// supports; docs/envoy/stream.md): a reply that removes or sets more
// headers than the header count limit, or whose result is over the count
// or the size limit (the map's byteSize: every key and value, pseudo
// headers included), fails the message, counted in
// rejected_header_mutations: the request ends in a 500 as for any
// mutation Envoy refuses (without failure_mode_allow).

// Envoy's defaults: max_request_headers_kb 60, max_headers_count 100.
const (
	defaultHeadersKb    = 60
	defaultHeadersCount = 100
)

// headerLimits are the count and size limits of the request's or the
// response's header map.
func (p *Proxy) headerLimits(response bool) (count, kb int) {
	count, kb = defaultHeadersCount, defaultHeadersKb
	if response {
		return count, kb
	}
	if p.cfg.MaxHeadersCount > 0 {
		count = p.cfg.MaxHeadersCount
	}
	if p.cfg.MaxRequestHeadersKb > 0 {
		kb = p.cfg.MaxRequestHeadersKb
	}
	return count, kb
}

// byteSize is the header map's size as Envoy counts it.
func (h headers) byteSize() int {
	n := 0
	for _, x := range h {
		n += len(x.k) + len(x.v)
	}
	return n
}
