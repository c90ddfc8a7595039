package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// runServe keeps one deployment running (fusebox on the embedded default
// config, envoysim playing envoy/envoy.yaml, two fake providers) with a
// real scripted incident that repeats: the first provider answers 503
// from second 5 to second 25 of every 90, while 2 requests a second flow.
// The dashboard at the admin address shows it as an operator would see
// one: the route opening, traffic on the other route, the probe, the
// close, the ramp. Real time, real clock: nothing is forced (#54: without
// Docker there was no way to see a real incident on the dashboard).
func runServe(ctx context.Context, out io.Writer, o options) error {
	if o.outageAt == 0 {
		o.outageAt, o.recoverAt, o.duration, o.perSecond = 5, 25, 90, 2
	}
	o.envoyConfig = repoFile("envoy/envoy.yaml")
	l, err := startLane("serve", o, o.envoyConfig, false)
	if err != nil {
		return err
	}
	defer l.stop()
	fmt.Fprintf(out, "fusebox demo, serving: the dashboard is at http://%s/dashboard (the API under /admin/v1/)\n", l.fb.AdminAddr())
	fmt.Fprintf(out, "openai_us_east answers 503 from second %d to second %d of every %d; %d requests a second. Ctrl-C stops it.\n",
		o.outageAt, o.recoverAt, o.duration, o.perSecond)
	tick := time.NewTicker(time.Second / time.Duration(o.perSecond))
	defer tick.Stop()
	start := time.Now()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "stopped")
			return nil
		case <-tick.C:
		}
		sec := int(time.Since(start)/time.Second) % o.duration
		if sec >= o.outageAt && sec < o.recoverAt {
			l.first.SetFault(fakeprovider.Fault{Status: 503})
		} else {
			l.first.SetFault(fakeprovider.Fault{})
		}
		request(l.proxy.URL(), n%2 == 0)
		lines := l.logs.Lines()
		for _, ln := range lines[l.seenLog:] {
			if i := strings.Index(ln, "transition="); i >= 0 && strings.Contains(ln, "[circuit_breaker]") {
				f := strings.Fields(ln[i:])
				fmt.Fprintf(out, "%s %s (%s)\n", time.Now().Format(time.TimeOnly), strings.TrimPrefix(f[0], "transition="), strings.TrimPrefix(f[1], "reason="))
			}
		}
		l.seenLog = len(lines)
	}
}
