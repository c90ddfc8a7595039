package e2e

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// TestProfileFigures prints, from envoysim's timestamps, what each profile
// adds to what a client sees: per response chunk, the time from the
// upstream to the client (the filters' share of every token), and the time
// to first byte over a proxy with no ext_proc at all, in one run. A
// measurement, not a check: FUSEBOX_FIGURES=1 runs it (make bench-wire
// prints it with the CPU figures).
func TestProfileFigures(t *testing.T) {
	if os.Getenv("FUSEBOX_FIGURES") == "" {
		t.Skip("FUSEBOX_FIGURES=1 prints what each profile adds per chunk and to the first byte")
	}
	const n = 300
	type fig struct {
		name          string
		chunks, first []time.Duration
	}
	var figs []fig
	for _, pr := range []struct {
		name, file string
		noExtProc  bool
	}{{"no ext_proc", "envoy.yaml", true}, {"synchronous (envoy.yaml)", "envoy.yaml", false}, {"observer (envoy-observer.yaml)", "envoy-observer.yaml", false}} {
		w := newWorldConfig(t, fuseboxConfig, func(w *world) { w.profile = profile{Name: pr.name, File: pr.file} })
		p := w.proxy("default", nil, func(c *envoysim.Config) {
			c.ChunkDelays = true
			if pr.noExtProc {
				c.ExtProc.Addr, c.Observer = "", nil
			}
		})
		for i := 0; i < n; i++ {
			chat(t, p, gpt, true)
		}
		f := fig{name: pr.name, chunks: p.Stats().ChunkDelays()}
		for _, e := range p.Log() {
			f.first = append(f.first, e.FirstByte)
		}
		figs = append(figs, f)
	}
	pct := func(d []time.Duration, q float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		d = slices.Clone(d)
		slices.Sort(d)
		return d[int(q*float64(len(d)-1))]
	}
	base := pct(figs[0].first, 0.5)
	for _, f := range figs {
		t.Logf("%-32s chunks %5d: upstream->client p50 %8v p99 %8v | first byte p50 %8v (+%v over no ext_proc), p99 %8v",
			f.name, len(f.chunks), pct(f.chunks, 0.5).Round(time.Microsecond), pct(f.chunks, 0.99).Round(time.Microsecond),
			pct(f.first, 0.5).Round(time.Microsecond), (pct(f.first, 0.5) - base).Round(time.Microsecond), pct(f.first, 0.99).Round(time.Microsecond))
	}
}
