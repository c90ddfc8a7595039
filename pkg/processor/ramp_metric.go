package processor

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// fusebox_route_ramp_ratio (R-D8): each route's share of the traffic it
// would get, 1 unless it is on its recovery ramp. Read at scrape time from
// the breakers (a Peek per route), so the decision path pays nothing.
var rampRatioDesc = prometheus.NewDesc("fusebox_route_ramp_ratio",
	"Share of the traffic a route would get that it takes (below 1 on its recovery ramp after a close).",
	[]string{"gateway", "route"}, nil)

type rampCollector struct{ s *Server }

func (c rampCollector) Describe(ch chan<- *prometheus.Desc) { ch <- rampRatioDesc }

func (c rampCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	rt := s.cfg.Load()
	if rt == nil {
		return
	}
	comp := s.compiledFor(rt)
	now := s.clock.Now().UnixNano()
	for _, id := range rt.GatewayIDs {
		for _, r := range rt.Gateways[id].RouteList {
			t := comp.targets[r]
			if t == nil {
				continue
			}
			ratio := 1.0
			if p := t.Peek(context.Background(), s.store, now).RampPermille; p > 0 {
				ratio = float64(p) / 1000
			}
			ch <- prometheus.MustNewConstMetric(rampRatioDesc, prometheus.GaugeValue, ratio, id, r.Key)
		}
	}
}
