package envoysim

import (
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// A message timeout (Envoy's ext_proc message_timeout with
// failure_mode_allow) is an event with a known outcome (SPEC R-DL14): Envoy
// goes on without the processor, and what fusebox can then count of the
// request follows from where it timed out and what became of the request.
// The proxy keeps one TimeoutEvent per timeout, never reset (ResetLog does
// not drop them), for a checker to count exactly.

// TimeoutEvent is one ext_proc message timeout and what became of its
// request.
type TimeoutEvent struct {
	// Phase is the message whose reply timed out: request_headers,
	// request_body, response_headers, response_body, response_trailers.
	Phase string
	// EndOfStream: the message carried its direction's end of stream (the
	// whole response was sent to the processor before its reply timed out:
	// it could judge it).
	EndOfStream bool
	// Role is the filter's: "route" (the route role), "observer", or
	// "attempt".
	Role string
	// Cluster and Status are the request's upstream cluster ("" when none
	// was picked) and its downstream status; Completed: the upstream's
	// answer reached the client whole (a 200, no flag, no reset).
	Cluster   string
	Status    int
	Completed bool
	// LateCluster is the cluster the processor's reply named after Envoy
	// stopped waiting for it (Envoy reads and ignores it): the route
	// fusebox decided for a request Envoy then sent elsewhere.
	LateCluster string
	ended       bool // the request's entry was recorded
}

// Timeouts returns the message timeouts so far, each with what became of
// its request.
func (p *Proxy) Timeouts() []TimeoutEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]TimeoutEvent, len(p.timeouts))
	for i, t := range p.timeouts {
		out[i] = *t
	}
	return out
}

// endOf reports whether a message ends its direction.
func endOf(req *extprocv3.ProcessingRequest) bool {
	switch x := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.RequestHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestBody:
		return x.RequestBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return x.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		return x.ResponseBody.GetEndOfStream()
	}
	return true // trailers end their direction
}

// phaseOf names a message for TimeoutEvent.Phase.
func phaseOf(req *extprocv3.ProcessingRequest) string {
	switch req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "response_trailers"
	}
	return ""
}

// timedOut keeps a timeout of e's stream, tied to its request's entry.
func (e *epStream) timedOut() {
	if e.entry == nil {
		return
	}
	role := "route"
	switch {
	case e.c == e.p.cfg.Observer:
		role = "observer"
	case e.c != &e.p.cfg.ExtProc:
		role = "attempt"
	}
	e.p.mu.Lock()
	defer e.p.mu.Unlock()
	if e.entry.timeout != nil {
		return // one per request: the first stops processing
	}
	ev := &TimeoutEvent{Phase: e.lastSent, EndOfStream: e.lastEOS, Role: role}
	e.entry.timeout = ev
	e.timeout = ev
	e.p.timeouts = append(e.p.timeouts, ev)
}

// lateReply reads a reply that came after Envoy stopped waiting: the
// cluster it named, for the timeout's event.
func (e *epStream) lateReply(resp *extprocv3.ProcessingResponse) {
	if e.timeout == nil || resp == nil {
		return
	}
	var cr *extprocv3.CommonResponse
	switch x := resp.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		cr = x.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		cr = x.RequestBody.GetResponse()
	}
	for _, o := range cr.GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), e.p.cfg.ClusterHeader) {
			v := o.GetHeader().GetValue()
			if v == "" {
				v = string(o.GetHeader().GetRawValue())
			}
			e.p.mu.Lock()
			e.timeout.LateCluster = v
			e.p.mu.Unlock()
		}
	}
}

// endTimeout fills in what became of a timed-out request (record).
func (p *Proxy) endTimeout(e *Entry) {
	if e.timeout == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := e.timeout
	t.Cluster, t.Status, t.ended = e.Cluster, e.Status, true
	t.Completed = e.Status == 200 && e.Flags == 0 && !e.Reset
}
