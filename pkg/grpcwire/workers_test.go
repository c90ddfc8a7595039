package grpcwire

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitIdle waits until n workers are idle (5 s).
func waitIdle(t *testing.T, w *Workers, n int32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.idle.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers, want %d", w.idle.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitIdleAtLeast waits until at least n workers are idle (5 s).
func waitIdleAtLeast(t *testing.T, w *Workers, n int32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.idle.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle workers, want at least %d", w.idle.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A worker is reused once its work is done; at most MaxIdle wait; Stop
// ends them.
func TestWorkers(t *testing.T) {
	w := &Workers{MaxIdle: 2}
	for i := 0; i < 10; i++ { // one after another: one goroutine
		done := make(chan struct{})
		w.Go(func() { close(done) })
		<-done
		// At least the one that ran it waits again. Exactly 1 failed on a
		// loaded CI machine: a job that came in the instant the worker
		// counted itself idle started a second one (allowed below), and
		// both then wait.
		waitIdleAtLeast(t, w, 1)
	}
	// 1, unless a job came in the instant between the worker counting
	// itself idle and waiting; never one per job.
	if n := w.started.Load(); n > 5 {
		t.Fatalf("10 jobs in turn started %d goroutines, want 1", n)
	}
	idle0, before := w.idle.Load(), w.started.Load()
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < 5; i++ {
		wg.Add(1)
		w.Go(func() { defer wg.Done(); <-release })
	}
	// Each idle worker takes one of them if it is already waiting (it
	// counts itself idle just before), so with 1 idle, 4 or 5 new ones.
	if n := w.started.Load() - before; n < 5-idle0 || n > 5 {
		t.Fatalf("5 jobs at once on %d idle workers: %d goroutines started, want %d to 5", idle0, n, 5-idle0)
	}
	close(release)
	wg.Wait()
	waitIdle(t, w, 2) // the idle bound
	w.Stop()
	waitIdle(t, w, 0)
	done := make(chan struct{})
	w.Go(func() { close(done) }) // after Stop: still runs
	<-done
}

// An idle worker keeps nothing of its last job alive.
func TestAnIdleWorkerKeepsNoJob(t *testing.T) {
	w := &Workers{}
	defer w.Stop()
	type big struct{ b [1 << 20]byte }
	v := &big{}
	collected := make(chan struct{})
	runtime.AddCleanup(v, func(struct{}) { close(collected) }, struct{}{})
	done := make(chan struct{})
	job := func(p *big) func() { return func() { p.b[0] = 1; close(done) } }(v)
	v = nil
	w.Go(job)
	job = nil
	<-done
	waitIdle(t, w, 1)
	for deadline := time.Now().Add(5 * time.Second); ; {
		runtime.GC()
		select {
		case <-collected:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle worker keeps its last job's closure alive")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An idle worker keeps nothing of the last function it ran: a stream's
// handler closure holds its stream, connection and server (and through
// the processor, a store), which a stopped fusebox must let go.
func TestAnIdleWorkerKeepsNothing(t *testing.T) {
	var w Workers
	type big struct{ b [1 << 16]byte }
	obj := &big{}
	var freed atomic.Bool
	runtime.AddCleanup(obj, func(f *atomic.Bool) { f.Store(true) }, &freed)
	done := make(chan struct{})
	w.Go(func() { obj.b[0]++; close(done) })
	<-done
	obj = nil
	for i := 0; i < 100 && !freed.Load(); i++ {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	if !freed.Load() {
		t.Fatal("an idle worker keeps the last function it ran, and all it holds, alive")
	}
}
