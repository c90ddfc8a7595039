package envoysim

import (
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Every response names its request (RequestHeader), a proxied answer and
// the processor's immediate response alike, and the name finds that
// request's access log entry wherever it sits in the log: a test that read
// the log's last entry as its own read another request's when entries came
// out of order (#54: TestFailFastAndTryAll on a loaded machine).
func TestEveryResponseFindsItsEntry(t *testing.T) {
	r := newRig(t, func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if h := req.GetRequestHeaders(); h != nil {
			for _, x := range h.GetHeaders().GetHeaders() {
				if x.Key == "x-answer-here" {
					return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
						Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Details: "here",
					}}}
				}
			}
		}
		return plain(req)
	})
	type sent struct {
		id     string
		status int
	}
	var all []sent
	for _, hdr := range [][]string{nil, {"x-answer-here", "1"}, nil} {
		resp, _ := r.post(`{}`, hdr...)
		id := resp.Header.Get(RequestHeader)
		if id == "" {
			t.Fatalf("a %d response names no request", resp.StatusCode)
		}
		e, ok := r.proxy.WaitLogged(id, 10*time.Second)
		if !ok || e.RequestID != id || e.Status != resp.StatusCode {
			t.Fatalf("request %s (%d): entry %+v, found %v", id, resp.StatusCode, e, ok)
		}
		all = append(all, sent{id, resp.StatusCode})
	}
	// The first request's entry is not the last: found by its name.
	for _, s := range all {
		if e, ok := r.proxy.Logged(s.id); !ok || e.Status != s.status {
			t.Fatalf("request %s: entry %+v, found %v", s.id, e, ok)
		}
	}
	if log := r.proxy.Log(); log[len(log)-1].RequestID != all[2].id {
		t.Fatalf("the log's last entry is %s", log[len(log)-1].RequestID)
	}
	// A request never logged: WaitLogged gives up at its bound.
	start := time.Now()
	if _, ok := r.proxy.WaitLogged("req-none", 50*time.Millisecond); ok || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("an unknown request was found, or the wait ended early (%v)", time.Since(start))
	}
}

// WaitLogged wakes as the entry is written, not on a poll: a waiter
// started before the request ends has it once it is recorded.
func TestWaitLoggedWakesOnTheEntry(t *testing.T) {
	r := newRig(t, plain)
	got := make(chan Entry, 1)
	go func() {
		e, _ := r.proxy.WaitLogged("req-1", 10*time.Second)
		got <- e
	}()
	resp, _ := r.post(`{}`)
	select {
	case e := <-got:
		if e.RequestID != "req-1" || resp.Header.Get(RequestHeader) != "req-1" {
			t.Fatalf("entry %q, response %q", e.RequestID, resp.Header.Get(RequestHeader))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never woke")
	}
}
