package e2e

import (
	"sync"
	"testing"

	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

var (
	shippedOnce sync.Once
	shipped     envoysim.Config
	shippedErr  error
)

// shippedDeployment is envoy/envoy.yaml as the proxy plays it: modes, header
// names, timeouts and the retry policy all come from the file.
func shippedDeployment(t *testing.T) envoysim.Config {
	shippedOnce.Do(func() {
		b, err := envoyconfig.Load("../../envoy/envoy.yaml")
		if err != nil {
			shippedErr = err
			return
		}
		shipped, shippedErr = envoyconfig.Harness(b)
	})
	if shippedErr != nil {
		t.Fatal(shippedErr)
	}
	c := shipped
	c.ExtProc.InitialMetadata = map[string]string{}
	for k, v := range shipped.ExtProc.InitialMetadata {
		c.ExtProc.InitialMetadata[k] = v
	}
	return c
}
