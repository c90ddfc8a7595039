package redisstore_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
)

// TestKeyFileMustBeRegularAndPrivate (#37): a fleet key file is a regular
// file no other user may write. Before, a FIFO blocked the read (validate
// and start-up hung until a writer came), and a world-writable file was
// taken without a word.
func TestKeyFileMustBeRegularAndPrivate(t *testing.T) {
	dir := t.TempDir()
	key := strings.Repeat("k", 32)
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(key), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, want string
	}{
		{"private", write("private", 0o600), ""},
		{"read-only for all", write("readable", 0o444), ""},
		{"world-writable", write("open", 0o666), "may be written by any user (mode 0666)"},
		{"a FIFO", fifo, "is not a regular file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := redisstore.ReadKeyFile(c.path); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("reading the key file blocked")
			}
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want %q", err, c.want)
			}
		})
	}
}
