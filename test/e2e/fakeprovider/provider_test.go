package fakeprovider

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Refuse refuses new connections and lets the answer in flight finish
// whole, as the provider tallies it; Down cuts it.
func TestRefuseLetsTheAnswerInFlightFinish(t *testing.T) {
	for _, c := range []struct {
		name     string
		stop     func(*Provider)
		complete int64
	}{
		{"Refuse", (*Provider).Refuse, 1},
		{"Down", (*Provider).Down, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Start("p")
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			p.SetFault(Fault{SlowFirstToken: 300 * time.Millisecond})
			got := make(chan string, 1)
			go func() {
				resp, err := http.Post("http://"+p.Addr()+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					got <- "error: " + err.Error()
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					got <- "cut: " + err.Error()
					return
				}
				got <- string(b)
			}()
			time.Sleep(100 * time.Millisecond) // the answer has begun and waits for its first token
			c.stop(p)
			body := <-got
			if n := p.Tally()["complete"]; n != c.complete {
				t.Fatalf("complete %d, want %d (the client read %q)", n, c.complete, body)
			}
			if c.complete == 1 && !strings.Contains(body, "[DONE]") {
				t.Fatalf("the tally says complete, the client read %q", body)
			}
			if _, err := http.Get("http://" + p.Addr() + "/"); err == nil {
				t.Fatal("a new connection was taken after the stop")
			}
		})
	}
}

// A quota is announced on every answer the way each provider does, runs
// out within its window (429 with Retry-After) and comes back when the
// window rolls.
func TestQuotaIsAnnouncedAndRunsOut(t *testing.T) {
	p, err := Start("q")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	p.SetQuota(Quota{Requests: 2, Window: time.Minute, Now: func() time.Time { return now }})
	post := func(path string) *http.Response {
		t.Helper()
		resp, err := http.Post("http://"+p.Addr()+path, "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	r := post("/v1/chat/completions")
	if r.StatusCode != 200 || r.Header.Get("x-ratelimit-remaining-requests") != "1" || r.Header.Get("x-ratelimit-reset-requests") != "1m0s" {
		t.Fatalf("first: %d %v", r.StatusCode, r.Header)
	}
	now = now.Add(30 * time.Second)
	r = post("/v1/messages")
	if r.StatusCode != 200 || r.Header.Get("anthropic-ratelimit-requests-remaining") != "0" || r.Header.Get("anthropic-ratelimit-requests-reset") != "2026-12-01T12:01:00Z" {
		t.Fatalf("second: %d %v", r.StatusCode, r.Header)
	}
	r = post("/v1/chat/completions")
	if r.StatusCode != 429 || r.Header.Get("Retry-After") != "30" || r.Header.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("past the quota: %d %v", r.StatusCode, r.Header)
	}
	now = now.Add(30 * time.Second)
	if r = post("/v1/chat/completions"); r.StatusCode != 200 || r.Header.Get("x-ratelimit-remaining-requests") != "1" {
		t.Fatalf("the next window: %d %v", r.StatusCode, r.Header)
	}
}
