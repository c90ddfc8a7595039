package e2e

import (
	"strings"
	"sync"
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

var (
	deploymentsMu sync.Mutex
	deployments   = map[string]envoysim.Config{}
)

// deploymentOf is an Envoy config file as the proxy plays it: modes, header
// names, timeouts and the retry policy all come from the file. Each file is
// read once; every caller gets its own copy of the maps it may change.
func deploymentOf(t *testing.T, path string) envoysim.Config {
	t.Helper()
	deploymentsMu.Lock()
	cfg, ok := deployments[path]
	if !ok {
		b, err := envoyconfig.Load(path)
		if err == nil {
			cfg, err = envoyconfig.Harness(b)
		}
		if err != nil {
			deploymentsMu.Unlock()
			t.Fatal(err)
		}
		deployments[path] = cfg
	}
	deploymentsMu.Unlock()
	c := cfg
	c.ExtProc.InitialMetadata = map[string]string{}
	for k, v := range cfg.ExtProc.InitialMetadata {
		c.ExtProc.InitialMetadata[k] = v
	}
	if cfg.Failover != nil {
		fo := *cfg.Failover
		c.Failover = &fo
	}
	if cfg.AccessLog != nil {
		al := *cfg.AccessLog
		c.AccessLog = &al
	}
	if cfg.Observer != nil {
		o := *cfg.Observer
		c.Observer = &o
	}
	return c
}

// TestNoFuseboxHeaderReachesAProvider (#35): in every shipped deployment
// envoysim plays (envoy.yaml and envoy-1.36.yaml on their releases,
// envoy-observer.yaml in the observer run, envoy-failover.yaml), no header
// fusebox sets (x-fusebox-cluster, -route, -fallbacks, -gateway, …) reaches
// a provider, healthy or routed around an outage; the failover deployment's
// x-fusebox-attempt is the one that must, sealed (R-X10, checked in
// TestFailoverHidesAnOutage).
func TestNoFuseboxHeaderReachesAProvider(t *testing.T) {
	type deployment struct {
		name  string
		start func(w *world) *envoysim.Proxy
		world func(t *testing.T) *world
		allow string
	}
	var ds []deployment
	for _, pr := range profiles {
		ds = append(ds, deployment{name: pr.Name, world: func(t *testing.T) *world { return newWorldOn(t, pr) },
			start: func(w *world) *envoysim.Proxy { return w.proxy("default", nil) }})
	}
	ds = append(ds, deployment{name: "failover", world: func(t *testing.T) *world { return newFailoverWorld(t) }, allow: "x-fusebox-attempt",
		start: func(w *world) *envoysim.Proxy { return w.failoverProxy() }})
	for _, d := range ds {
		t.Run(d.name, func(t *testing.T) {
			w := d.world(t)
			p := d.start(w)
			check := func(provider string) {
				t.Helper()
				hdr, _ := w.providers[provider].LastRequest()
				for k := range hdr {
					if k := strings.ToLower(k); strings.HasPrefix(k, "x-fusebox-") && k != d.allow {
						t.Fatalf("%s: fusebox's %s reached %s", d.name, k, provider)
					}
				}
			}
			if r := chat(t, p, gpt, true); r.status != 200 {
				t.Fatalf("healthy: %d", r.status)
			}
			check(chat(t, p, gpt, false).servedBy())
			w.providers["openai_us"].SetFault(fakeprovider.Fault{Status: 503})
			served := ""
			for i := 0; i < 6; i++ {
				if r := chat(t, p, gpt, i%2 == 0); r.status == 200 {
					served = r.servedBy()
				}
			}
			if served == "" || served == "openai_us" {
				t.Fatalf("never routed around the outage (last served by %q)", served)
			}
			check(served)
			check("openai_us")
		})
	}
}
