package mainlib

import (
	"errors"
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TuneGC sets GOGC and GOMEMLIMIT only where the environment does not,
// and a container's limit becomes the soft limit.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	// A limit far above what any test process holds: the test changes
	// the process's own settings while other tests run in it.
	const gib = 1 << 40
	ratio := MemoryLimitRatio
	want80 := int64(float64(gib) * ratio)
	cases := []struct {
		name        string
		env         map[string]string
		limit       memlimit.Provider
		wantPercent int
		wantLimit   int64
		wantErr     bool
		log         string
	}{
		{"a container with 1 TiB", nil, memlimit.Limit(gib), DefaultGCPercent, want80, false, "GOGC=400, GOMEMLIMIT=838860"},
		{"no container limit", nil, func() (uint64, error) { return 0, memlimit.ErrNoLimit }, DefaultGCPercent, math.MaxInt64, false, "GOGC=400, no memory limit"},
		{"not in a cgroup", nil, func() (uint64, error) { return 0, memlimit.ErrNoCgroup }, DefaultGCPercent, math.MaxInt64, false, "GOGC=400, no memory limit"},
		{"an unreadable limit", nil, func() (uint64, error) { return 0, errors.New("permission denied") }, DefaultGCPercent, math.MaxInt64, true, "GOGC=400, no memory limit"},
		{"GOGC from the environment", map[string]string{"GOGC": "150"}, memlimit.Limit(gib), 150, want80, false, "GOMEMLIMIT=838860"},
		{"GOMEMLIMIT from the environment", map[string]string{"GOMEMLIMIT": "300MiB"}, memlimit.Limit(gib), DefaultGCPercent, math.MaxInt64, false, "GOGC=400, no memory limit"},
		{"AUTOMEMLIMIT=off", map[string]string{"AUTOMEMLIMIT": "off"}, memlimit.Limit(gib), DefaultGCPercent, math.MaxInt64, false, "GOGC=400, no memory limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			s := TuneGC(func(k string) string { return c.env[k] }, c.limit)
			if s.Percent != c.wantPercent || s.Limit != c.wantLimit || (s.LimitErr != nil) != c.wantErr {
				t.Fatalf("got %+v, want percent %d, limit %d, error %v", s, c.wantPercent, c.wantLimit, c.wantErr)
			}
			if got := debug.SetMemoryLimit(-1); got != c.wantLimit {
				t.Fatalf("the runtime's limit is %d, want %d", got, c.wantLimit)
			}
			if c.env["GOGC"] == "" {
				// The runtime's own setting, read back the way the start
				// log line reads it.
				if got := collectorSettings(); !strings.Contains(got, c.log) {
					t.Fatalf("the start log says %q, want %q in it", got, c.log)
				}
			} else if got := collectorSettings(); !strings.Contains(got, "GOGC=100") {
				// GOGC in the environment is the runtime's own reading:
				// TuneGC leaves the percent alone.
				t.Fatalf("TuneGC changed the percent GOGC set: %q", got)
			}
		})
	}
}
