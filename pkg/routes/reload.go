package routes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Reload results, the values of aig_config_reloads_total{result}.
const (
	ReloadSuccess = "success"
	ReloadError   = "error"
)

// Reloader keeps the Holder in step with a config file. A new file that does
// not compile is refused and the last good Runtime stays in force; both
// outcomes are reported to OnResult. It polls the file's metadata (size,
// mtime) and content hash rather than relying on inotify, which misses the
// symlink swaps Kubernetes uses for mounted ConfigMaps.
type Reloader struct {
	Path   string
	Holder *Holder
	Log    *slog.Logger
	// OnResult is called with ReloadSuccess or ReloadError after each
	// attempt (metrics).
	OnResult func(result string)
	// OnRefusedRead is called when a read of the file was refused (R-L10:
	// not a regular file, over the size limit, too slow), besides OnResult.
	OnRefusedRead func()
	// OnFallback is called once per R-P2 fallback per policy version.
	OnFallback func(Fallback)
	// Started holds the file's start-only settings as the process started
	// with them (R-P10); nil = no check.
	Started *StartSettings
	// Manager, when set, composes the file with the admin overlays and
	// puts the result in force (R-API2a: a reload never drops an overlay).
	Manager *Manager

	// Settle is how long a changed file must stay unchanged before a poll
	// applies it (R-L7); 0 = two seconds. SIGHUP does not wait.
	Settle time.Duration
	// Now is the clock of the settle time (tests); nil = time.Now.
	Now func() time.Time
	// MaxBytes bounds a read of the file (limits.max_config_bytes as
	// fusebox started: a start-only setting); 0 = DefaultMaxConfigBytes.
	MaxBytes int64
	// ReadTimeout bounds one read; 0 = ConfigReadTimeout.
	ReadTimeout time.Duration

	// mu serialises reloads and polls. It is held while ApplyFile takes
	// the manager's lock, so nothing the manager calls may take it:
	// reporting has its own lock (R-L11).
	mu       sync.Mutex
	lastSize int64
	lastMod  time.Time
	// reportMu guards warned, the fallbacks already logged.
	reportMu sync.Mutex
	warned   map[string]bool
	// pending is a change seen by a poll and not applied yet.
	pending     string // content hash
	pendingFrom time.Time
	// refused is the file (size, mtime, mode) whose read a poll refused
	// last: logged and counted once, not at every poll.
	refused string
}

// Report logs the warnings and R-P2 fallbacks of a Runtime just put in force;
// a fallback is logged once per policy version.
func (r *Reloader) Report(rt *Runtime) {
	r.reportMu.Lock()
	defer r.reportMu.Unlock()
	for _, w := range rt.Warnings {
		r.log().Warn("[config] " + w)
	}
	if r.warned == nil {
		r.warned = map[string]bool{}
	}
	for _, fb := range rt.Fallbacks {
		k := fb.Where + "|" + fb.Field + "|" + fb.PolicyVersion
		if r.warned[k] {
			continue
		}
		r.warned[k] = true
		r.log().Warn("[config] malformed status list in stored config; using the default",
			"where", fb.Where, "field", fb.Field, "problem", fb.Problem, "policy_version", fb.PolicyVersion)
		if r.OnFallback != nil {
			r.OnFallback(fb)
		}
	}
}

func (r *Reloader) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

// Reload reads and compiles the file now (SIGHUP). On error the Runtime in
// force is kept.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, err := os.Stat(r.Path); err == nil {
		r.lastSize, r.lastMod = st.Size(), st.ModTime()
	}
	return r.reload()
}

func (r *Reloader) reload() error {
	r.pending = ""
	data, err := r.read()
	if err != nil {
		r.refuse(err)
		return err
	}
	return r.apply(data)
}

// read reads the file within the R-L10 bounds.
func (r *Reloader) read() ([]byte, error) {
	max, timeout := r.MaxBytes, r.ReadTimeout
	if max <= 0 {
		max = DefaultMaxConfigBytes
	}
	if timeout <= 0 {
		timeout = ConfigReadTimeout
	}
	return readBounded(r.Path, max, timeout)
}

// refuse logs and counts a reload that was refused; the Runtime in force
// stays.
func (r *Reloader) refuse(err error) {
	var refused *ReadRefusedError
	if errors.As(err, &refused) && r.OnRefusedRead != nil {
		r.OnRefusedRead()
	}
	r.log().Error("[config] reload refused; the last good config stays in force", "path", r.Path, "error", err)
	r.result(ReloadError)
}

// apply compiles data and puts it in force; on error the Runtime in force
// is kept.
func (r *Reloader) apply(data []byte) error {
	sum := sha256.Sum256(data)
	if cur := r.Holder.Load(); cur != nil && cur.Hash == hex.EncodeToString(sum[:]) {
		return nil // same document: nothing to do
	}
	var rt *Runtime
	var err error
	if r.Manager != nil {
		rt, err = r.Manager.ApplyFile(data, r.keepStartSettings)
	} else if rt, err = Parse(data, Options{}); err == nil {
		r.keepStartSettings(rt)
		r.Holder.Store(rt)
	}
	if err != nil {
		r.log().Error("[config] reload refused; the last good config stays in force", "path", r.Path, "error", err)
		r.result(ReloadError)
		return err
	}
	r.Report(rt)
	r.log().Info("[config] reloaded", "path", r.Path, "gateways", len(rt.Gateways), "hash", rt.Hash[:12])
	r.result(ReloadSuccess)
	return nil
}

// keepStartSettings gives rt the start-only settings in force (R-P10): a
// changed listener, token variable or store needs a restart, and says so.
func (r *Reloader) keepStartSettings(rt *Runtime) {
	if r.Started == nil {
		return
	}
	for _, field := range r.Started.Changed(StartSettingsOf(rt)) {
		r.log().Warn("[config] "+field+" changed in the file; it takes effect only at start: restart fusebox to apply it", "field", field)
	}
	if cur := r.Holder.Load(); cur != nil {
		rt.Listen, rt.Limits, rt.Admin, rt.Store, rt.Envoy = cur.Listen, cur.Limits, cur.Admin, cur.Store, cur.Envoy
	}
}

func (r *Reloader) result(s string) {
	if r.OnResult != nil {
		r.OnResult(s)
	}
}

// Check is one poll. A file whose size or modification time changed is not
// applied at once: it must keep the same content across polls for Settle,
// so that a file written in place in parts is never half-applied (R-L7).
// It reports whether a reload was attempted.
func (r *Reloader) Check() (attempted bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := os.Stat(r.Path)
	if err != nil {
		return false, nil // a file being replaced may be briefly absent
	}
	if r.pending == "" && st.Size() == r.lastSize && st.ModTime().Equal(r.lastMod) {
		return false, nil
	}
	data, err := r.read()
	if err != nil {
		var refused *ReadRefusedError
		if !errors.As(err, &refused) {
			return false, nil // being replaced: the next poll reads it
		}
		// Refused (a device, a FIFO, too large): once per change of the
		// file, not at every poll.
		sig := fmt.Sprintf("%d|%d|%v", st.Size(), st.ModTime().UnixNano(), st.Mode())
		r.lastSize, r.lastMod, r.pending = st.Size(), st.ModTime(), ""
		if sig == r.refused {
			return false, nil
		}
		r.refused = sig
		r.refuse(err)
		return true, err
	}
	r.refused = ""
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	now := r.now()
	if hash != r.pending || st.Size() != r.lastSize || !st.ModTime().Equal(r.lastMod) {
		// New content (or still being written): start the settle time.
		r.pending, r.pendingFrom = hash, now
		r.lastSize, r.lastMod = st.Size(), st.ModTime()
		return false, nil
	}
	if now.Sub(r.pendingFrom) < r.settle() {
		return false, nil
	}
	r.pending = ""
	return true, r.apply(data)
}

func (r *Reloader) settle() time.Duration {
	if r.Settle > 0 {
		return r.Settle
	}
	return 2 * time.Second
}

func (r *Reloader) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Prime records the file's current metadata so that the first Check does not
// reload the file just loaded.
func (r *Reloader) Prime() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, err := os.Stat(r.Path); err == nil {
		r.lastSize, r.lastMod = st.Size(), st.ModTime()
	}
}

// Run polls the file every interval until ctx ends, and reloads at once on
// each value received from hup (SIGHUP).
func (r *Reloader) Run(ctx context.Context, interval time.Duration, hup <-chan os.Signal) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = r.Check()
		case <-hup:
			_ = r.Reload()
		}
	}
}
