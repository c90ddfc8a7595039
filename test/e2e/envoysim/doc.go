// Package envoysim is a small HTTP proxy that plays Envoy for fusebox's
// end-to-end tests: the filter chain of the shipped deployment (early
// header mutation, header_mutation, the route-role ext_proc filter, the
// router) behaving as docs/ext_proc.md describes — raw_value headers,
// mutation rules, clear_route_cache semantics, literal mode overrides, one
// message per streamed chunk, numeric response flags, message timeouts,
// failure_mode_allow, Envoy's local replies and its retry policy. It must
// never be kinder than Envoy: where Envoy fails a request, so does this.
//
// It fails closed on its config (runtime.go): a runtime key it does not
// play, a response_flag_filter flag it cannot set, or an access log filter
// other than response_flag_filter (envoyconfig) refuses the load, unless
// the key is on ignoredRuntime with the reason it does not matter.
//
// It is test code: it favours being obviously right over being fast.
package envoysim
