// Command fakeproviders runs fake LLM providers for docker-compose and
// manual trials: one per -provider name=addr flag. Faults are injected with
// POST /__fault on each provider, e.g.
//
//	curl -d '{"status":503}' localhost:9001/__fault
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var providers list
	flag.Var(&providers, "provider", "name=host:port (repeatable)")
	flag.Parse()
	if len(providers) == 0 {
		fmt.Fprintln(os.Stderr, "usage: fakeproviders -provider openai_us_east=0.0.0.0:9001 [-provider …]")
		os.Exit(2)
	}
	for _, spec := range providers {
		name, addr, ok := strings.Cut(spec, "=")
		if !ok {
			log.Fatalf("bad -provider %q: want name=host:port", spec)
		}
		p, err := fakeprovider.StartOn(name, addr)
		if err != nil {
			log.Fatalf("%s: %v", name, err)
		}
		log.Printf("fake provider %s on %s", name, p.Addr())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
}
