// Command extproc is fusebox: an Envoy ext_proc sidecar that keeps a circuit
// breaker per LLM route. The wiring lives in mainlib so tests can run it
// in-process; this file only turns signals into a context.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := mainlib.Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "extproc:", err)
		os.Exit(1)
	}
}
