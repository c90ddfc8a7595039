package main

import (
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// folded holds the metrics of every stopped fusebox instance as one set:
// each series summed over the instances. Keeping each instance's gathered
// families instead grew the harness's heap by a set per fusebox restart
// (115 KiB over the observer soak's 11), which the memory invariant then
// read as fusebox's.
type folded struct {
	fams   map[string]*dto.MetricFamily
	series map[string]*dto.Metric // by family name and label pairs
}

// fold adds the counters and histograms of fams into f; other types are
// not kept (the checks read none).
func (f *folded) fold(fams []*dto.MetricFamily) {
	if f.fams == nil {
		f.fams, f.series = map[string]*dto.MetricFamily{}, map[string]*dto.Metric{}
	}
	for _, fam := range fams {
		if fam.GetType() != dto.MetricType_COUNTER && fam.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		into := f.fams[fam.GetName()]
		if into == nil {
			into = &dto.MetricFamily{Name: fam.Name, Type: fam.Type}
			f.fams[fam.GetName()] = into
		}
		for _, m := range fam.Metric {
			k := seriesKey(fam.GetName(), m)
			have := f.series[k]
			if have == nil {
				have = &dto.Metric{Label: m.Label}
				if m.Counter != nil {
					have.Counter = &dto.Counter{Value: new(float64)}
				}
				if m.Histogram != nil {
					have.Histogram = &dto.Histogram{SampleCount: new(uint64), SampleSum: new(float64)}
					for _, b := range m.Histogram.Bucket {
						have.Histogram.Bucket = append(have.Histogram.Bucket, &dto.Bucket{UpperBound: b.UpperBound, CumulativeCount: new(uint64)})
					}
				}
				f.series[k] = have
				into.Metric = append(into.Metric, have)
			}
			addSeries(have, m)
		}
	}
}

func addSeries(have, m *dto.Metric) {
	if c := m.Counter; c != nil && have.Counter != nil {
		*have.Counter.Value += c.GetValue()
	}
	if h := m.Histogram; h != nil && have.Histogram != nil {
		*have.Histogram.SampleCount += h.GetSampleCount()
		*have.Histogram.SampleSum += h.GetSampleSum()
		for i, b := range h.Bucket {
			if i < len(have.Histogram.Bucket) && have.Histogram.Bucket[i].GetUpperBound() == b.GetUpperBound() {
				*have.Histogram.Bucket[i].CumulativeCount += b.GetCumulativeCount()
			}
		}
	}
}

func seriesKey(name string, m *dto.Metric) string {
	var b strings.Builder
	b.WriteString(name)
	for _, l := range m.Label { // Gather sorts the pairs by name
		b.WriteString("\x00" + l.GetName() + "=" + l.GetValue())
	}
	return b.String()
}

// families returns a copy of the folded set, one family per name (the
// caller reads it without the rig's lock). The copy is made by hand:
// proto.Clone's first use builds the protobuf reflection of every dto
// type, 200 KiB the memory invariant read as the load's.
func (f *folded) families() []*dto.MetricFamily {
	out := make([]*dto.MetricFamily, 0, len(f.fams))
	for _, fam := range f.fams {
		c := &dto.MetricFamily{Name: fam.Name, Type: fam.Type}
		for _, m := range fam.Metric {
			cm := &dto.Metric{Label: m.Label} // the pairs are never written
			if m.Counter != nil {
				cm.Counter = &dto.Counter{Value: ptr(m.Counter.GetValue())}
			}
			if h := m.Histogram; h != nil {
				cm.Histogram = &dto.Histogram{SampleCount: ptr(h.GetSampleCount()), SampleSum: ptr(h.GetSampleSum())}
				for _, b := range h.Bucket {
					cm.Histogram.Bucket = append(cm.Histogram.Bucket, &dto.Bucket{UpperBound: ptr(b.GetUpperBound()), CumulativeCount: ptr(b.GetCumulativeCount())})
				}
			}
			c.Metric = append(c.Metric, cm)
		}
		out = append(out, c)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
