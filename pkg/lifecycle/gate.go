package lifecycle

import (
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
)

// ArrivalGate is what the note said of an attempt's arrival: a replayed
// token's attempt records nothing. The attempt's response may be judged
// before the note answers; its record then waits for the answer off the
// reply path (record), bounded by gateWait.
type ArrivalGate struct {
	done   chan struct{}
	replay atomic.Bool
	clock  breaker.Clock // the server's: the wait's bound runs on it
}

// gateWait bounds how long a record waits for the arrival's answer; past
// it the attempt is recorded (a meeting place that does not answer must
// not lose an outcome, R-DL7).
const gateWait = time.Second

// NewArrivalGate is the gate of one attempt, its bound on clock c.
func NewArrivalGate(c breaker.Clock) *ArrivalGate {
	return &ArrivalGate{done: make(chan struct{}), clock: c}
}

// Open gives the arrival's answer: replay when the note said the
// token's attempt had arrived before.
func (g *ArrivalGate) Open(replay bool) {
	g.replay.Store(replay)
	close(g.done)
}

// Known reports whether the answer came, and whether it was a replay.
func (g *ArrivalGate) Known() (known, replay bool) {
	select {
	case <-g.done:
		return true, g.replay.Load()
	default:
		return false, false
	}
}

// Wait waits for the answer (at most gateWait) and reports a replay.
func (g *ArrivalGate) Wait() bool {
	select {
	case <-g.done:
		return g.replay.Load()
	default:
	}
	expired := make(chan struct{})
	t := breaker.AfterFunc(g.clock, gateWait, func() { close(expired) })
	defer t.Stop()
	select {
	case <-g.done:
		return g.replay.Load()
	case <-expired:
		return false
	}
}
