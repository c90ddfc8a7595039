package e2e

import (
	"sync"
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
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
	return c
}
