package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// The shipped sidecars (deploy/kubernetes, the chart's sidecar mode) give
// Envoy fusebox's listener as a pipe address: the same outage moves
// traffic over a Unix socket as over TCP, on both gRPC transports, with
// the ext_proc stream, the health check and the access log all on it.
func TestOutageOverAUnixSocket(t *testing.T) {
	for _, server := range []string{"fusebox", "grpc-go"} {
		t.Run(server, func(t *testing.T) {
			// A short directory: sun_path holds 107 bytes.
			dir, err := os.MkdirTemp("", "fbsock")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			w := newWorldConfig(t, fuseboxConfig, func(w *world) {
				w.grpcAddr = "unix://" + filepath.Join(dir, "extproc.sock")
				w.args = append(w.args, "-grpc-server", server)
			})
			p := w.proxy("default", nil)
			if r := chat(t, p, gpt, true); r.status != 200 || r.servedBy() != "openai_us" {
				t.Fatalf("healthy: %d %q", r.status, r.servedBy())
			}
			w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
			failed := 0
			for i := 0; i < 8; i++ {
				if r := chat(t, p, gpt, i%2 == 0); r.status != 200 {
					failed++
				} else if r.servedBy() != "azure_eu" {
					t.Fatalf("request %d served by %q", i, r.servedBy())
				}
			}
			if failed != 3 {
				t.Fatalf("%d client errors before routing around, want failure_threshold=3", failed)
			}
			if b := w.breaker("default", "openai:us-east:gpt-4o-mini"); b["state"] != "open" {
				t.Fatalf("status API: %v", b)
			}
		})
	}
}
