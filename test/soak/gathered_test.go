package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Two stopped instances fold into one set: each series summed, the set's
// size that of one instance however many restarts there were.
func TestFoldSumsTheInstances(t *testing.T) {
	instance := func(n int) []*dto.MetricFamily {
		reg := prometheus.NewRegistry()
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outcomes_total"}, []string{"route"})
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "duration_seconds", Buckets: []float64{0.001, 0.01}}, []string{"phase"})
		reg.MustRegister(c, h)
		for i := 0; i < n; i++ {
			c.WithLabelValues("a").Inc()
			h.WithLabelValues("request_body").Observe(0.005)
		}
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	var f folded
	for i := 0; i < 10; i++ {
		f.fold(instance(3))
	}
	fams := map[string]*dto.MetricFamily{}
	for _, fam := range f.families() {
		fams[fam.GetName()] = fam
	}
	if got := fams["outcomes_total"].Metric; len(got) != 1 || got[0].GetCounter().GetValue() != 30 {
		t.Fatalf("counter: %v", got)
	}
	h := fams["duration_seconds"].Metric
	if len(h) != 1 || h[0].GetHistogram().GetSampleCount() != 30 || h[0].GetHistogram().Bucket[1].GetCumulativeCount() != 30 || h[0].GetHistogram().Bucket[0].GetCumulativeCount() != 0 {
		t.Fatalf("histogram: %v", h)
	}
}
