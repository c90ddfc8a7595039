package routes

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestReloadRefusesWhatItMustNotRead (R-L10): a config path that became a
// FIFO, a symlink to a device or a file over limits.max_config_bytes is
// refused at once, logged and counted, and the last good config stays.
// Before, a FIFO blocked the reloader for ever, /dev/zero was read until
// memory ran out and a file of any size was accepted.
func TestReloadRefusesWhatItMustNotRead(t *testing.T) {
	big := baseYAML + "# " + strings.Repeat("x", 64<<10) + "\n"
	cases := []struct {
		name string
		make func(t *testing.T, path string)
		want string
	}{
		{"fifo", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Skip("mkfifo:", err)
			}
		}, "not a regular file"},
		{"symlink to /dev/zero", func(t *testing.T, path string) {
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"over max_config_bytes", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(big), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "over limits.max_config_bytes"},
		{"symlink to a file over max_config_bytes", func(t *testing.T, path string) {
			target := path + ".target"
			if err := os.WriteFile(target, []byte(big), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "over limits.max_config_bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "fusebox.yaml")
			rt := mustParse(t, baseYAML)
			h := NewHolder(rt)
			var mu sync.Mutex
			results := map[string]int{}
			r := &Reloader{Path: path, Holder: h, MaxBytes: 32 << 10,
				OnResult: func(s string) { mu.Lock(); results[s]++; mu.Unlock() }}
			if err := os.WriteFile(path, []byte(baseYAML), 0o600); err != nil {
				t.Fatal(err)
			}
			r.Prime()
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			tc.make(t, path)
			// The poller sees the change: refused once, not at every poll.
			for range 3 {
				_, _ = r.Check()
			}
			errc := make(chan error, 1)
			go func() { errc <- r.Reload() }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(10 * time.Second):
				t.Fatal("the reload did not return within 10 s")
			}
			var refused *ReadRefusedError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("reload error = %v, want a refusal saying %q", err, tc.want)
			}
			if h.Load() != rt {
				t.Fatal("a refused reload replaced the config")
			}
			mu.Lock()
			defer mu.Unlock()
			if results[ReloadError] != 2 || results[ReloadSuccess] != 0 {
				t.Fatalf("reload results = %v, want error 2 (the first poll and the SIGHUP)", results)
			}
		})
	}
}

// TestConfigOverItsOwnLimit: a document larger than its own
// limits.max_config_bytes does not compile (start and validate agree).
func TestConfigOverItsOwnLimit(t *testing.T) {
	doc := "limits: {max_config_bytes: 4096}\n" + baseYAML + "# " + strings.Repeat("x", 4096) + "\n"
	_, err := Parse([]byte(doc), Options{})
	if err == nil || !strings.Contains(err.Error(), "limits.max_config_bytes: the document is") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Parse([]byte("limits: {max_config_bytes: 10}\n"+baseYAML), Options{}); err == nil || !strings.Contains(err.Error(), "limits.max_config_bytes: must be in") {
		t.Fatalf("err = %v", err)
	}
}

// TestReadFileFollowsSymlinksToRegularFiles: a ConfigMap's symlink chain
// still loads.
func TestReadFileFollowsSymlinksToRegularFiles(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "..data", "fusebox.yaml")
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, []byte(baseYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "fusebox.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(link); err != nil {
		t.Fatal(err)
	}
}
