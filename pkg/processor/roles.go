package processor

import extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

// roleStream is one ext_proc stream as serve drives it: the route role's
// (stream: the decision) or the attempt role's (attemptStream: the
// per-attempt rewrites in a provider cluster's upstream chain). Both judge
// and record a response with the same component, stream's response side
// (response.go), so the two roles cannot judge one outcome differently;
// neither role's request path carries the other's branches.
type roleStream interface {
	handle(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
	// fallback is the reply after a panic (R-D7).
	fallback(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
	// finish runs once when the stream ends.
	finish()
}
