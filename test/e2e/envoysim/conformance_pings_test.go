package envoysim

import (
	"testing"

	"github.com/fusebox-llm/fusebox/test/h2spy"
)

// Envoy's connection to an ext_proc cluster sends no PING unless the
// cluster sets connection_keepalive, and advertises the cluster's window
// (docs/envoy.md, "No PING without connection_keepalive"). Before,
// envoysim's grpc-go connections pinged once per round trip while
// replies flowed (BDP estimation), work fusebox never gets from Envoy.
func TestSideStreamConnectionsSendNoPings(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window int
		want   int64
	}{{"release default", 0, 16 << 20}, {"the file's window", 1 << 20, 1 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			var spy *h2spy.Spy
			r := newRig(t, plain, func(c *Config) {
				var err error
				if spy, err = h2spy.Listen(c.ExtProc.Addr); err != nil {
					t.Fatal(err)
				}
				c.ExtProc.Addr = spy.Addr()
				c.ExtProc.StreamWindow = tc.window
			})
			for range 20 {
				if resp, _ := r.post(`{"model":"m"}`); resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
			r.proxy.Close()
			spy.Close()
			if spy.Conns() == 0 {
				t.Fatal("no connection went through the spy")
			}
			if spy.Pings() != 0 {
				t.Errorf("envoysim sent %d PING frames to the ext_proc cluster in 20 requests; Envoy sends none", spy.Pings())
			}
			if w := spy.Window(); w != tc.want {
				t.Errorf("SETTINGS_INITIAL_WINDOW_SIZE %d, want %d", w, tc.want)
			}
			if w := spy.ConnWindow(); w != 24<<20 {
				t.Errorf("connection window %d, want the release's default, 24 MiB", w)
			}
		})
	}
}
