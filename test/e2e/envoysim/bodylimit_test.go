package envoysim

import (
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// A body over the buffer limit (docs/envoy/body-limit.md). BUFFERED: the
// route role is sent the request headers and decides, then the filter
// manager answers 413 request_payload_too_large, no flag, no body message,
// nothing upstream; the 413 takes the response path. NONE: nothing
// buffers the body, which reaches the upstream whole. Before, envoysim
// answered 413 before any ext_proc message in every mode.
func TestBodyOverTheBufferLimit(t *testing.T) {
	big := `{"x":"` + strings.Repeat("a", 4096) + `"}`
	cases := []struct {
		name string
		mode filterv3.ProcessingMode_BodySendMode
	}{
		{"buffered", filterv3.ProcessingMode_BUFFERED},
		{"none", filterv3.ProcessingMode_NONE},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, plain, func(c *Config) {
				c.BufferLimit = 1024
				c.ExtProc.RequestBodyMode = tc.mode
			})
			resp, _ := r.post(big)
			var kinds []string
			for _, q := range r.proc.requests() {
				switch q.Request.(type) {
				case *extprocv3.ProcessingRequest_RequestHeaders:
					kinds = append(kinds, "request_headers")
				case *extprocv3.ProcessingRequest_RequestBody:
					kinds = append(kinds, "request_body")
				case *extprocv3.ProcessingRequest_ResponseHeaders:
					kinds = append(kinds, "response_headers:"+statusOf(q.GetResponseHeaders()))
				}
			}
			got := strings.Join(kinds, " ")
			log := r.proxy.Log()
			if tc.mode == filterv3.ProcessingMode_BUFFERED {
				if resp.StatusCode != 413 || !strings.HasPrefix(got, "request_headers response_headers:413") || strings.Contains(got, "request_body") {
					t.Fatalf("%d, the processor saw %q; want 413 after the request headers, no body message", resp.StatusCode, got)
				}
				if r.def.hits+r.up.hits != 0 {
					t.Fatal("the body over the limit reached an upstream")
				}
				if e := log[len(log)-1]; e.Flags != 0 || e.Details != "request_payload_too_large" || e.Status != 413 {
					t.Fatalf("entry %d flags %d details %q", e.Status, e.Flags, e.Details)
				}
				if r.proxy.Stats().Get("downstream_rq_too_large") != 1 {
					t.Fatal("downstream_rq_too_large not counted")
				}
				return
			}
			if resp.StatusCode != 200 || r.def.body != big {
				t.Fatalf("%d, upstream got %d bytes of %d", resp.StatusCode, len(r.def.body), len(big))
			}
		})
	}
}

func statusOf(h *extprocv3.HttpHeaders) string {
	for _, x := range h.GetHeaders().GetHeaders() {
		if x.Key == ":status" {
			return string(x.RawValue)
		}
	}
	return ""
}

// A request body mode envoysim does not play is refused: in the config
// (New), and in a mode override (a 500 that names it).
func TestUnplayedRequestBodyModesRefused(t *testing.T) {
	cfg := Config{ExtProc: ExtProcConfig{RequestBodyMode: filterv3.ProcessingMode_STREAMED}}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "request_body_mode") {
		t.Fatalf("STREAMED request bodies accepted: %v", err)
	}
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		resp := plain(req)
		if req.GetRequestHeaders() != nil {
			resp.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_BUFFERED_PARTIAL}
		}
		return resp
	})
	resp, _ := r.post(`{}`)
	if e := r.proxy.Log()[0]; resp.StatusCode != 500 || !strings.Contains(e.Details, "BUFFERED_PARTIAL") {
		t.Fatalf("%d %q", resp.StatusCode, e.Details)
	}
}
