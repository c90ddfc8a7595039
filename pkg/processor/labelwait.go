package processor

import (
	"sync"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// A broken answer's label (R-AL4, R-O9). An answer that began and broke
// before its end is a neither whatever broke it, but what broke it only
// Envoy's access log entry says: the client went away (DC, DR), one of
// Envoy's timers cut it (UT, SI: cut_mid_answer), the provider reset it
// (UR on a 2xx: stream_error). The route role's stream (or the
// observer's) ends the same way in each case, and the entry, though Envoy
// writes it first, travels on another gRPC stream and may land after.
//
// So a broken answer is recorded on its breakers at the stream's end, as
// a neither (its probe slot is free at once), and only its label — the
// outcome counter's reason — waits here, on this replica alone, for
// access_log.wait_ms: the entry that reaches it names the reason; when
// none does it is a client_cancel. Nothing is written to the store for it.
// Before, the neither was a client_cancel unless the entry had come first,
// and always on the observer profile.

// brokenLabel is what a broken answer's record counted and has not yet
// labelled.
type brokenLabel struct{ route, fleet bool }

// labelWaits holds the broken answers waiting for their entry, by
// decision id, and the labels of entries that came first for a decision
// another path holds (the observer's, which claimed it in its note: the
// entry is a duplicate there, and its label waits here for the
// observer's stream to end).
type labelWaits struct {
	mu    sync.Mutex
	m     map[string]*labelWait
	early map[string]earlyLabel
}

type earlyLabel struct {
	reason string
	at     int64 // unix ns, on the server's clock
}

type labelWait struct {
	st    *stream
	timer breaker.Timer
}

// maxLabelWaits bounds the waits: past it a broken answer is counted a
// client_cancel at once, as before (a wait holds one stream).
const maxLabelWaits = 20000

// recordBroken records st's broken answer now and its label once known.
func (st *stream) recordBroken() {
	s := st.s
	wait := st.rt.AccessLogWait
	id := st.decisionID
	if id == "" || wait <= 0 || st.recorded || !st.tracked || st.gate != nil {
		// An attempt whose record waits on its gate: labelled at once.
		// (Whether an access log stream is connected says nothing: Envoy
		// opens it at its first entry, which may be this one.)
		st.recordNeither()
		return
	}
	st.label = &brokenLabel{}
	st.recordNeither()
	if lb := st.label; !lb.route && !lb.fleet {
		st.label = nil // nothing was counted (recorded elsewhere first)
		return
	}
	switch reason, added := s.labels.add(id, st, wait, s.clock, &s.timers); {
	case reason != "":
		st.countLabel(reason) // the entry came first
	case !added:
		st.countLabel(breaker.ReasonClientCancel)
	}
}

// countLabel counts the broken answer's outcome under reason.
func (st *stream) countLabel(reason string) {
	lb := st.label
	if lb == nil {
		return
	}
	m := st.s.metrics.Outcomes
	if lb.route {
		m.WithLabelValues(st.gw.ID, st.chosen.Key, breaker.Neither.String(), reason, "").Inc()
	}
	if lb.fleet {
		m.WithLabelValues(st.gw.ID, st.chosen.Fleet.BreakerKey(), breaker.Neither.String(), reason, "").Inc()
	}
}

// add makes st wait for decision id's label, unless an entry already
// left one (kept by keepEarly within the wait): then reason is it. added
// is false when the table is full.
func (l *labelWaits) add(id string, st *stream, wait time.Duration, clock breaker.Clock, ts *timerSet) (reason string, added bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.early[id]; ok {
		delete(l.early, id)
		if e.at >= clock.Now().UnixNano()-wait.Nanoseconds() {
			return e.reason, false
		}
	}
	if l.m == nil {
		l.m = map[string]*labelWait{}
	}
	if _, dup := l.m[id]; dup || len(l.m) >= maxLabelWaits {
		return "", false
	}
	w := &labelWait{st: st}
	l.m[id] = w
	w.timer = ts.after(clock, wait, func() {
		if l.take(id, w) {
			st.countLabel(breaker.ReasonClientCancel)
		}
	})
	return "", true
}

// take removes id's wait if it is still w (nil: whichever).
func (l *labelWaits) take(id string, w *labelWait) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, ok := l.m[id]
	if !ok || w != nil && cur != w {
		return false
	}
	delete(l.m, id)
	return true
}

// labelled applies an entry to decision id's broken answer waiting here:
// its neither is counted under the entry's reason (any other verdict of
// an answer that began and broke is a client_cancel). false: no such wait, or an
// entry that names another route's cluster (a client cannot steer an
// outcome, R-AL4), left to the other paths.
func (s *Server) labelled(id string, out entryOutcome) bool {
	s.labels.mu.Lock()
	w, ok := s.labels.m[id]
	if !ok || out.cluster != "" && out.cluster != w.st.chosen.Cluster {
		s.labels.mu.Unlock()
		return false
	}
	delete(s.labels.m, id)
	s.labels.mu.Unlock()
	w.timer.Stop()
	reason := breaker.ReasonClientCancel
	if out.res.Kind == breaker.KindNeither {
		reason = out.res.Reason
	}
	w.st.countLabel(reason)
	return true
}

// maxEarlyLabels bounds the labels kept for streams still to end.
const maxEarlyLabels = 20000

// keepEarly keeps an entry's label (a neither's reason) for decision id,
// for a broken answer whose stream has not ended yet; when that stream
// has begun to wait meanwhile, it is counted now. Past the table's bound
// (older than wait dropped first) the label is dropped.
func (l *labelWaits) keepEarly(id, reason string, now, wait int64) {
	l.mu.Lock()
	if w, ok := l.m[id]; ok {
		delete(l.m, id)
		l.mu.Unlock()
		w.timer.Stop()
		w.st.countLabel(reason)
		return
	}
	defer l.mu.Unlock()
	if l.early == nil {
		l.early = map[string]earlyLabel{}
	}
	if n := len(l.early); n >= maxEarlyLabels || n >= 1024 && n%256 == 0 {
		for k, v := range l.early {
			if v.at < now-wait {
				delete(l.early, k)
			}
		}
		if len(l.early) >= maxEarlyLabels {
			return
		}
	}
	l.early[id] = earlyLabel{reason: reason, at: now}
}

// waiting reports how many broken answers wait for their label (tests).
func (l *labelWaits) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
