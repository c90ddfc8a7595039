package routes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAdminReloadRefreshNeverDeadlock (R-L11) runs admin changes, SIGHUP
// reloads of a changing file, polled reloads and shared-store refreshes at
// the same time. Before the fix an admin change held the manager's lock
// while reporting through the reloader's, and a reload held the reloader's
// while applying through the manager's: this hung within a second.
func TestAdminReloadRefreshNeverDeadlock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fusebox.yaml")
	doc := func(n int) []byte {
		return []byte(strings.Replace(baseYAML, "failure_threshold: 10", fmt.Sprintf("failure_threshold: %d", 10+n%7), 1))
	}
	if err := os.WriteFile(path, doc(0), 0o600); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	mgr := &Manager{Store: &FileOverlays{Path: filepath.Join(dir, "overlays.json")}}
	rt, err := mgr.Open(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHolder(rt)
	// A config swap does work of its own (the breakers' install).
	h.OnSwap(func(*Runtime) { runtime.Gosched() })
	rl := &Reloader{Path: path, Holder: h, Manager: mgr, Settle: time.Nanosecond}
	mgr.Holder, mgr.Report = h, rl.Report
	rf := &Refresher{Manager: mgr}
	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { defer bg.Done(); rf.Run(ctx) }()

	stop := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	loop := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				f(i)
			}
		}()
	}
	loop(func(i int) { // PATCH
		_, _ = mgr.Patch(context.Background(), "default", []byte(fmt.Sprintf(`{"circuit_breaker":{"failure_threshold":%d}}`, 1+i%40)))
	})
	loop(func(i int) { // the file changes, and SIGHUP
		_ = os.WriteFile(path, doc(i), 0o600)
		_ = rl.Reload()
	})
	loop(func(int) { _, _ = rl.Check() }) // the poller
	loop(func(int) {                      // the feed: refreshes, direct and through the refresher
		_ = mgr.Refresh(context.Background())
		rf.Notify()
	})
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("deadlock: admin changes, reloads and refreshes still running 20 s after they were told to stop\n%s", buf[:runtime.Stack(buf, true)])
	}
	cancel()
	bg.Wait()
	// Still live: one more change and one more reload go through.
	if _, err := mgr.Patch(context.Background(), "default", []byte(`{"circuit_breaker":{"failure_threshold":42}}`)); err != nil {
		t.Fatal(err)
	}
	if got := h.Load().Gateways["default"].Policy.FailureThreshold; got != 42 {
		t.Fatalf("threshold after the last PATCH = %d, want 42", got)
	}
}
