package processor

import (
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/lifecycle"
)

// BenchmarkObserveNoteSeal is the observer profile's per-decision cost of
// the sealed note: the route role seals it, the observer opens it.
func BenchmarkObserveNoteSeal(b *testing.B) {
	s := lifecycle.NewSealer([]byte("fleet"))
	n := observeNote{Decision: lifecycle.NewDecisionID(), Parked: lifecycle.Park{Gateway: "default", Route: "openai:us-east:gpt-4o-mini", Cluster: "openai_us_east", RouteGen: 3, Start: 1796000000000000000}, ReqNs: 41000, Replica: 77}
	b.ReportAllocs()
	for b.Loop() {
		sealed := s.SealFor(lifecycle.ObserveAAD, []byte(n.Encode()))
		plain, err := s.OpenFor(lifecycle.ObserveAAD, sealed)
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := lifecycle.ParseObserveNote(string(plain)); !ok {
			b.Fatal("parse")
		}
	}
}
