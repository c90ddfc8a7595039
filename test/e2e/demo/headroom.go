package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
)

// headroomSummary is what the headroom demo measured per lane.
type headroomSummary struct {
	tooMany, requests int
	servedBy          map[string]int
}

// runHeadroom (-headroom) shows the rate-limit headroom (SPEC §15): the
// first provider allows 10 requests in each 10 s window and says so on
// every answer, as OpenAI does; the same traffic goes to two deployments,
// the left without headroom (clients meet the quota: 429s), the right with
// headroom {min_requests: 3} (the route is passed over before its quota
// runs out, and comes back when the window rolls: no 429).
func runHeadroom(out io.Writer, o options) (off, on *headroomSummary, err error) {
	if o.duration == 0 {
		o.duration, o.perSecond = 30, 4
	}
	withHeadroom := func(doc string) string {
		return strings.Replace(doc, "    cooldown_ms: 30000\n", "    cooldown_ms: 30000\n    headroom: {min_requests: 3}\n", 1)
	}
	a, err := startLane("without headroom", o, repoFile("envoy/envoy.yaml"), false)
	if err != nil {
		return nil, nil, err
	}
	defer a.stop()
	b, err := startLane("with headroom", o, repoFile("envoy/envoy.yaml"), false, withHeadroom)
	if err != nil {
		return nil, nil, err
	}
	defer b.stop()
	lanes := []*lane{a, b}
	sums := []*headroomSummary{{servedBy: map[string]int{}}, {servedBy: map[string]int{}}}
	for _, l := range lanes {
		now := time.Now
		if l.fake != nil {
			now = l.fake.Now
		}
		l.first.SetQuota(fakeprovider.Quota{Requests: 10, Window: 10 * time.Second, Now: now})
	}
	fmt.Fprintf(out, "fusebox headroom demo: openai_us_east allows 10 requests per 10 s and announces what is left (x-ratelimit-remaining-requests)\n")
	fmt.Fprintf(out, "%d requests a second to each deployment; left: no headroom; right: headroom {min_requests: 3}\n\n", o.perSecond)
	fmt.Fprintf(out, "%-5s | %-22s %-10s | %-22s %-10s\n", "t", "openai_us_east", "azure_eu_west", "openai_us_east", "azure_eu_west")
	start := time.Now()
	for sec := 0; sec < o.duration; sec++ {
		row := fmt.Sprintf("t+%02ds ", sec)
		for i, l := range lanes {
			counts := map[string][2]int{}
			for r := 0; r < o.perSecond; r++ {
				code, by := request(l.proxy.URL(), r%2 == 0)
				sums[i].requests++
				c := counts[by]
				if code == 200 {
					c[0]++
					sums[i].servedBy[by]++
				} else {
					c[1]++
					if code == 429 {
						sums[i].tooMany++
					}
				}
				counts[by] = c
				if !o.fast {
					time.Sleep(time.Second / time.Duration(2*o.perSecond+1))
				}
			}
			first := fmtCount(counts["openai_us_east"])
			first = strings.Replace(first, "errors", "429s", 1)
			row += fmt.Sprintf("| %-22s %-10s ", first, fmtCount(counts["azure_eu_west"]))
		}
		fmt.Fprintln(out, strings.TrimRight(row, " "))
		nextSecond(lanes, o, start, sec)
	}
	fmt.Fprintf(out, `
Without headroom (left): %d of %d requests got a 429 — each window's quota ran out and the clients met it
(a 429 with Retry-After blocks the route until then, so a few per window, once it is already too late).
With headroom (right): %d 429s. Every answer of openai_us_east said how many requests were left; once
that was below 3, fusebox passed the route over (stage action "saturated") until the announced reset,
and azure_eu_west took the rest; at the reset the route was back. On Redis the first replica to read
it passes the route over for the whole fleet.
`, sums[0].tooMany, sums[0].requests, sums[1].tooMany)
	return sums[0], sums[1], nil
}
