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
