// Package logbuf holds the one log sink the test harnesses share: a buffer
// fusebox's logger writes to from many goroutines while a test reads it.
package logbuf

import (
	"bufio"
	"bytes"
	"io"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writes and reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines returns everything written so far, one entry per line.
func (l *Buffer) Lines() []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader([]byte(l.String())))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// Prefixed returns a writer whose every write lands in l with prefix
// before it, in one piece (slog writes a line per call): the fleet's
// replicas share one buffer and stay apart in it.
func (l *Buffer) Prefixed(prefix string) io.Writer {
	return prefixed{l, prefix}
}

type prefixed struct {
	l      *Buffer
	prefix string
}

func (p prefixed) Write(b []byte) (int, error) {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	p.l.b.WriteString(p.prefix)
	p.l.b.Write(b)
	return len(b), nil
}
