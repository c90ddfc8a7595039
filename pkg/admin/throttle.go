package admin

import (
	"sync"
	"time"
)

// logThrottle lets at most one refusal line a second through per kind of
// refusal; the next line that passes says how many were held back. A
// scanner hammering the admin port must not fill the disk with our logs.
type logThrottle struct {
	mu   sync.Mutex
	now  func() time.Time
	last map[string]time.Time
	held map[string]int
}

func newLogThrottle() *logThrottle {
	return &logThrottle{now: time.Now, last: map[string]time.Time{}, held: map[string]int{}}
}

// allow reports whether a line of kind what may be written now, and how
// many lines of that kind were held back since the last one written.
func (t *logThrottle) allow(what string) (bool, int) {
	if t == nil {
		return true, 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if last, ok := t.last[what]; ok && now.Sub(last) < time.Second {
		t.held[what]++
		return false, 0
	}
	t.last[what] = now
	n := t.held[what]
	t.held[what] = 0
	return true, n
}
