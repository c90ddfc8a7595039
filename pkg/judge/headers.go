package judge

import (
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/fusebox-llm/fusebox/pkg/extproc"
)

// Headers is what the response headers say, parsed.
type Headers struct {
	Head
	RetryAfter, RetryAfterMs, XMSRetryAfterMs string
	Headroom                                  HeadroomRaw // the rate-limit headers (headroom.go)
}

func ParseHeaders(h *extprocv3.HttpHeaders, req *extprocv3.ProcessingRequest) Headers {
	var p Headers
	if h.Headers != nil {
		for _, hv := range h.Headers.Headers {
			switch hv.Key {
			case ":status":
				p.Status, _ = strconv.Atoi(extproc.HeaderValue(hv))
			case "retry-after":
				p.RetryAfter = extproc.HeaderValue(hv)
			case "retry-after-ms":
				p.RetryAfterMs = extproc.HeaderValue(hv)
			case "x-ms-retry-after-ms":
				p.XMSRetryAfterMs = extproc.HeaderValue(hv)
			case "x-envoy-overloaded":
				p.Overloaded = extproc.HeaderValue(hv) == "true"
			case "content-type":
				p.ContentType = extproc.HeaderValue(hv)
			default:
				if slot := HeadroomHeader(hv.Key); slot >= 0 {
					p.Headroom.Add(slot, extproc.HeaderValue(hv))
				}
			}
		}
	}
	p.EndOfStream = h.EndOfStream
	p.Flags, p.HasFlags, p.Details, p.HasDetails = extproc.Attributes(req.Attributes)
	return p
}
