package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The demo's timeline on a simulated clock: the outage is routed around after
// exactly failure_threshold client errors, and recovery closes the breaker.
func TestDemoFast(t *testing.T) {
	var out bytes.Buffer
	s, f, err := runBoth(&out, options{fast: true})
	if err != nil {
		t.Fatal(err)
	}
	// The same outage with failover: no client error, the breaker still
	// opens on the failed attempts and recovers the same way.
	if f.clientErrors != 0 {
		t.Errorf("with failover: %d client errors, want 0", f.clientErrors)
	}
	if strings.Join(f.transitions, ";") != strings.Join([]string{"closed->open (provider_5xx)", "open->half_open (cooldown_elapsed)", "half_open->closed (probe_success)"}, ";") {
		t.Errorf("with failover: transitions %v", f.transitions)
	}
	if s.clientErrors != 5 {
		t.Errorf("client errors %d, want 5 (the threshold)", s.clientErrors)
	}
	want := []string{"closed->open (provider_5xx)", "open->half_open (cooldown_elapsed)", "half_open->closed (probe_success)"}
	if strings.Join(s.transitions, ";") != strings.Join(want, ";") {
		t.Errorf("transitions %v", s.transitions)
	}
	if !s.backOnFirstRoute {
		t.Error("traffic did not return to the first route")
	}
	// R-D8: after the close the first route earns its traffic back: for a
	// while both routes serve.
	if s.rampSeconds == 0 {
		t.Error("no recovery ramp after the close: the first route took everything at once")
	}
	for _, w := range []string{"t+00s", "open", "What happened"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q", w)
		}
	}
	t.Log("\n" + out.String())
}

// The headroom demo on a simulated clock: without headroom the clients
// meet the quota; with it, none does and the other route takes the rest.
func TestDemoHeadroomFast(t *testing.T) {
	var out bytes.Buffer
	off, on, err := runHeadroom(&out, options{fast: true})
	if err != nil {
		t.Fatal(err)
	}
	if off.tooMany == 0 {
		t.Errorf("without headroom no 429: the demo shows nothing\n%s", out.String())
	}
	if on.tooMany != 0 || on.servedBy["azure_eu_west"] == 0 || on.servedBy["openai_us_east"] == 0 {
		t.Errorf("with headroom: %d 429s, served %v; want none, both routes\n%s", on.tooMany, on.servedBy, out.String())
	}
	t.Log("\n" + out.String())
}

// #54: demo -serve keeps a fusebox running with a real incident for the
// dashboard: the first route opens on the provider's 503s, on the real
// clock, and the dashboard and API answer at the address it prints; it
// stops when its context ends.
func TestDemoServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, pw, options{serve: "127.0.0.1:0", outageAt: 1, recoverAt: 60, duration: 120, perSecond: 10})
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var addr string
	opened := false
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "http://"); i >= 0 && addr == "" {
			addr = strings.Fields(line[i:])[0]
		}
		if strings.Contains(line, "closed->open (provider_5xx)") {
			opened = true
			break
		}
	}
	if addr == "" || !opened {
		t.Fatalf("no dashboard address (%q) or no open", addr)
	}
	base := strings.TrimSuffix(addr, "/dashboard")
	for _, path := range []string{"/dashboard", "/admin/v1/gateways/default/circuit-breaker"} {
		resp, err := http.Get(base + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s%s: %v %v", base, path, err, resp)
		}
		resp.Body.Close()
	}
	cancel()
	go io.Copy(io.Discard, pr)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
