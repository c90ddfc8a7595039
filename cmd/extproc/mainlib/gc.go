package mainlib

import (
	"errors"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultGCPercent is the collector's target (GOGC) of a fusebox process
// that was given none. fusebox's live heap is small (a few MiB on the
// default config) and it allocates per message, so Go's default of 100
// collects every few MiB: dozens of cycles a second under load, each
// scanning every goroutine's stack. At 400 the heap between collections is
// five times the live heap, a few tens of MiB, and the collector's share of
// the CPU falls: make bench-wire, same run, GOGC 100 against 400, fusebox's
// CPU per lifecycle over the stock null server 0.81x -> 0.62x synchronous,
// 0.70x -> 0.64x observer (docs/deploy.md, "Memory and the collector").
const DefaultGCPercent = 400

// MemoryLimitRatio is the share of the container's memory limit (its
// cgroup's) that becomes the collector's soft limit (GOMEMLIMIT) when none
// is set: near it the collector runs as often as it must, whatever GOGC
// says, so the larger target never turns into an out-of-memory kill.
const MemoryLimitRatio = 0.8

// GCSettings is what TuneGC set.
type GCSettings struct {
	// Percent is the collector's target (GOGC), and PercentFromEnv whether
	// GOGC chose it.
	Percent        int
	PercentFromEnv bool
	// Limit is the soft memory limit in bytes (math.MaxInt64: none).
	Limit int64
	// LimitErr is why the limit could not be read (it is then unset).
	LimitErr error
}

// TuneGC sets the collector for a long-running fusebox: GOGC to
// DefaultGCPercent unless the environment sets GOGC, and GOMEMLIMIT to
// MemoryLimitRatio of the container's memory limit unless the environment
// sets GOMEMLIMIT (or AUTOMEMLIMIT=off). The command calls it once at its
// start; tests that run fusebox in process keep their own collector.
func TuneGC(getenv func(string) string, limit memlimit.Provider) GCSettings {
	var s GCSettings
	if v := getenv("GOGC"); v != "" {
		s.PercentFromEnv = true
		s.Percent = -1 // "off"
		if n, err := strconv.Atoi(v); err == nil {
			s.Percent = n
		}
	} else {
		s.Percent = DefaultGCPercent
		debug.SetGCPercent(DefaultGCPercent)
	}
	if limit == nil {
		limit = memlimit.FromCgroup
	}
	if getenv("GOMEMLIMIT") != "" || getenv("AUTOMEMLIMIT") == "off" {
		s.Limit = debug.SetMemoryLimit(-1)
		return s
	}
	s.Limit, s.LimitErr = memlimit.Set(memlimit.WithRatio(MemoryLimitRatio), memlimit.WithProvider(limit))
	if errors.Is(s.LimitErr, memlimit.ErrNoCgroup) || errors.Is(s.LimitErr, memlimit.ErrCgroupsNotSupported) {
		s.LimitErr = nil // not in a container: no limit to keep under
	}
	if s.LimitErr != nil {
		s.Limit = debug.SetMemoryLimit(-1)
	}
	return s
}

// collectorSettings says the process's collector settings as the start log
// line gives them, read back from the runtime (whoever set them).
func collectorSettings() string {
	ss := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(ss)
	p := "GOGC=off"
	if ss[0].Value.Kind() == metrics.KindUint64 && ss[0].Value.Uint64() > 0 {
		p = "GOGC=" + strconv.FormatUint(ss[0].Value.Uint64(), 10)
	}
	if ss[1].Value.Kind() != metrics.KindUint64 || ss[1].Value.Uint64() >= math.MaxInt64 {
		return p + ", no memory limit"
	}
	return p + ", GOMEMLIMIT=" + strconv.FormatUint(ss[1].Value.Uint64()>>20, 10) + "MiB"
}
