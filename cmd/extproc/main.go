package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/test/e2e/simulate"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "extproc: %v: draining (a second signal exits at once)\n", s)
		cancel()
		s = <-sig
		// An operator who signals twice wants the process gone now, not
		// after the grace period.
		fmt.Fprintf(os.Stderr, "extproc: second signal (%v): exiting now\n", s)
		os.Exit(1)
	}()
	if len(os.Args) > 1 && os.Args[1] == "simulate" {
		// Try a config without Envoy: the real fusebox, envoysim playing
		// envoy/envoy.yaml, a scripted outage (test/e2e/simulate).
		if err := simulate.Main(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "extproc simulate:", err)
			os.Exit(1)
		}
		return
	}
	if err := mainlib.Main(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "extproc:", err)
		var ee *mainlib.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.Code)
		}
		os.Exit(1)
	}
}
