package grpcwire

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// waitGoroutines waits until runtime.NumGoroutine() is want (5 s).
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, want %d", runtime.NumGoroutine(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// A worker is reused once its work is done; at most MaxIdle wait; Stop
// ends them.
func TestWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	w := &Workers{MaxIdle: 2}
	for i := 0; i < 10; i++ { // one after another: one goroutine
		done := make(chan struct{})
		w.Go(func() { close(done) })
		<-done
		waitGoroutines(t, base+1)
	}
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < 5; i++ {
		wg.Add(1)
		w.Go(func() { defer wg.Done(); <-release })
	}
	waitGoroutines(t, base+5)
	close(release)
	wg.Wait()
	waitGoroutines(t, base+2) // the idle bound
	w.Stop()
	waitGoroutines(t, base)
	done := make(chan struct{})
	w.Go(func() { close(done) }) // after Stop: still runs
	<-done
}
