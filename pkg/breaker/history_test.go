package breaker

import "testing"

func TestHistory(t *testing.T) {
	h := NewHistory()
	id := RouteID("g", "p:r:m")
	t0 := int64(1_800_000_000) * 1e9
	h.Add(id, Success, t0)
	h.Add(id, Failure, t0+5e9)
	h.Add(id, Failure, t0+12e9)
	h.Add(id, Neither, t0+12e9)
	pts := h.Points(id, t0+15e9, HistoryBuckets)
	if len(pts) != HistoryBuckets {
		t.Fatalf("%d points", len(pts))
	}
	last, prev := pts[len(pts)-1], pts[len(pts)-2]
	if prev.Success != 1 || prev.Failure != 1 || last.Failure != 1 || last.Neither != 1 || last.At != 1_800_000_010 {
		t.Fatalf("prev %+v last %+v", prev, last)
	}
	// Periods older than the ring are forgotten, not wrapped around.
	later := t0 + int64((HistoryBuckets+1)*HistoryBucketSec)*1e9 + 1e9
	for _, p := range h.Points(id, later, HistoryBuckets) {
		if p.Success+p.Failure+p.Neither != 0 {
			t.Fatalf("stale period %+v", p)
		}
	}
	// 15 minutes are kept (the chart), and the sparkline's last 5 are the
	// same periods.
	if HistoryBuckets*HistoryBucketSec != 15*60 {
		t.Fatalf("the history keeps %d s", HistoryBuckets*HistoryBucketSec)
	}
	if spark := h.Points(id, t0+15e9, SparkBuckets); len(spark) != SparkBuckets || spark[SparkBuckets-1] != pts[HistoryBuckets-1] {
		t.Fatalf("the sparkline's points: %d, last %+v", len(spark), spark[len(spark)-1])
	}
	h.Retain(map[ID]bool{})
	if p := h.Points(id, t0+15e9, HistoryBuckets); p[len(p)-1].Failure != 0 {
		t.Fatal("Retain kept a removed breaker")
	}
}
