package main

import (
	"bytes"
	"testing"
	"time"
)

// The short profile of the campaign, in make test: every fault of the
// schedule several times over about 30 s of paced traffic, every invariant
// checked.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs for about a minute")
	}
	rep, err := Run(Options{Requests: 15000, Concurrency: 16, Rate: 500, Faults: true, FaultEvery: time.Second, EnvoyYAML: "../../envoy/envoy.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.Print(&b)
	t.Log("\n" + b.String())
	for _, f := range []string{"503_burst", "refused", "reset_mid_stream", "slow_first_token", "429_retry_after", "reload", "force_open", "fusebox_restart"} {
		if rep.Faults[f] == 0 {
			t.Errorf("fault %s never ran", f)
		}
	}
	for _, c := range rep.Failed() {
		t.Errorf("invariant broken: %s — %s", c.Name, c.Detail)
	}
	if rep.Outcomes["success"] == 0 || rep.Transitions == 0 {
		t.Fatalf("the campaign did nothing: %+v", rep)
	}
}
