package bench

import (
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
)

// failsafe-go's time-based breaker (the closest to fusebox's sliding
// window): TryAcquirePermit, then RecordSuccess, as an executor does.
func newFailsafe() circuitbreaker.CircuitBreaker[any] {
	return circuitbreaker.NewBuilder[any]().
		WithFailureThresholdPeriod(1<<30, time.Minute).
		WithDelay(30 * time.Second).
		Build()
}

func BenchmarkFailsafePermitRecord(b *testing.B) {
	cb := newFailsafe()
	b.ReportAllocs()
	for b.Loop() {
		if !cb.TryAcquirePermit() {
			b.Fatal("refused")
		}
		cb.RecordSuccess()
	}
}

// failsafe-go's permit alone: its decision.
func BenchmarkFailsafePermit(b *testing.B) {
	cb := newFailsafe()
	b.ReportAllocs()
	for b.Loop() {
		if !cb.TryAcquirePermit() {
			b.Fatal("refused")
		}
	}
}

func BenchmarkFailsafePermitRecordParallel(b *testing.B) {
	cb := newFailsafe()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			cb.TryAcquirePermit()
			cb.RecordSuccess()
		}
	})
}
