package envoysim

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// A message timeout is an event with a known outcome (R-DL14): envoysim
// keeps where it timed out, what became of the request, and the cluster a
// reply that came too late named (Envoy reads and ignores it). A soak
// counts with them exactly, with no allowance.
func TestMessageTimeoutEvents(t *testing.T) {
	late := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if req.GetRequestBody() != nil {
			time.Sleep(400 * time.Millisecond)
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: "x-fusebox-cluster", RawValue: []byte("chosen")}}}}}}}}
		}
		return plain(req)
	}
	// By default the filter resets its stream right after the half-close
	// (streamclose.go): the late reply is never read. With the graceful
	// close guard it is read, and ignored.
	for _, tc := range []struct {
		name        string
		runtime     map[string]string
		lateCluster string
	}{
		{"reset at once", nil, ""},
		{"graceful close", map[string]string{gracefulCloseGuard: "true"}, "chosen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, late, func(c *Config) {
				c.ExtProc.FailureModeAllow = true
				c.Runtime = tc.runtime
				c.ExtProc.MessageTimeout = 300 * time.Millisecond
			})
			if resp, _ := r.post(`{}`); resp.StatusCode != 200 {
				t.Fatalf("%d", resp.StatusCode)
			}
			// A late reply the filter reads comes about 100 ms after the
			// timeout: waited for up to a hang bound. Where none can come
			// (the stream was reset), a second shows nothing came.
			wait := time.Second
			if tc.lateCluster != "" {
				wait = 30 * time.Second
			}
			var got []TimeoutEvent
			deadline := time.Now().Add(wait)
			for {
				got = r.proxy.Timeouts()
				if len(got) == 1 && got[0].LateCluster != "" || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			want := TimeoutEvent{Phase: "request_body", EndOfStream: true, Role: "route", Cluster: "default", Status: 200, Completed: true, LateCluster: tc.lateCluster, ended: true}
			if len(got) != 1 || got[0] != want {
				t.Fatalf("timeouts %+v, want [%+v]", got, want)
			}
			r.proxy.ResetLog()
			if len(r.proxy.Timeouts()) != 1 {
				t.Fatal("ResetLog dropped the timeouts")
			}
		})
	}
}
