package envoysim

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// Stats are the operator-visible counters of docs/ext_proc.md, by name
// (streams_started, spurious_msgs_received, failure_mode_allowed,
// message_timeouts, rejected_header_mutations, clear_route_cache_ignored,
// upstream_rq_retry, no_cluster, upstream_rq_timeout, …).
type Stats struct {
	mu sync.Mutex
	m  map[string]int
	// waits counts the route role's request-path replies by how long
	// Envoy waited for each, in whole milliseconds (the last bucket
	// holds everything longer): the time fusebox held the request before
	// it could be routed.
	waits [waitBuckets]int
	// markedWaits are the waits of replies that began while a test had
	// marked the time (MarkWindow): a fault's window, held against the
	// rest of the same run.
	markedWaits [waitBuckets]int
	marked      int
	// chunks are how long each response chunk took from the upstream to
	// the client (the latency the filters added to it), up to maxChunks,
	// when Config.ChunkDelays asks for them (a soak must not grow a
	// slice).
	chunks       []time.Duration
	recordChunks bool
}

const maxChunks = 1 << 18

func (s *Stats) chunk(d time.Duration) {
	if !s.recordChunks {
		return
	}
	s.mu.Lock()
	if len(s.chunks) < maxChunks {
		s.chunks = append(s.chunks, d)
	}
	s.mu.Unlock()
}

// ChunkDelays returns what each response chunk waited between the
// upstream and the client, in arrival order (at most 2^18 of them).
func (s *Stats) ChunkDelays() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.chunks...)
}

const waitBuckets = 2001

func (s *Stats) wait(d time.Duration, marked bool) {
	ms := min(int(d/time.Millisecond), waitBuckets-1)
	s.mu.Lock()
	if marked {
		s.markedWaits[ms]++
	} else {
		s.waits[ms]++
	}
	s.mu.Unlock()
}

// MarkWindow marks the time from now until the matching MarkWindow(false)
// (windows may nest): the request-path waits of replies begun meanwhile
// are counted apart (MarkedWaits), so a test can hold a fault's windows
// against the rest of the same run on the same machine.
func (s *Stats) MarkWindow(on bool) {
	s.mu.Lock()
	if on {
		s.marked++
	} else if s.marked > 0 {
		s.marked--
	}
	s.mu.Unlock()
}

func (s *Stats) inWindow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.marked > 0
}

// MarkedWaits is RequestPathWaits for the replies begun in a marked
// window; RequestPathWaits counts the others.
func (s *Stats) MarkedWaits(over time.Duration) (n, longer int, longest time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return waitsOver(&s.markedWaits, over)
}

func waitsOver(h *[waitBuckets]int, over time.Duration) (n, longer int, longest time.Duration) {
	for ms, c := range h {
		if c == 0 {
			continue
		}
		n += c
		if time.Duration(ms)*time.Millisecond >= over {
			longer += c
		}
		longest = time.Duration(ms) * time.Millisecond
	}
	return n, longer, longest
}

// RequestPathWaits reports how many route-role request-path replies Envoy
// waited for, how many of them longer than over, and the longest wait (to
// the millisecond; 2 s means 2 s or more).
func (s *Stats) RequestPathWaits(over time.Duration) (n, longer int, longest time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return waitsOver(&s.waits, over)
}

func (s *Stats) add(name string) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]int{}
	}
	s.m[name]++
	s.mu.Unlock()
}

// Get returns a counter.
func (s *Stats) Get(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[name]
}

// Entry is one access-log line: what the client got and why.
type Entry struct {
	// logged: written to the log already (record runs once).
	logged bool
	// traceCtx: the request's span, when the proxy traces (tracing.go).
	traceCtx context.Context
	Start    time.Time
	Method   string
	Path     string
	Status   int
	Flags    uint64
	Details  string
	Route    string // "cluster_header" or "default"
	Cluster  string
	Metadata map[string]*structpb.Struct // dynamic metadata, by namespace
	Reset    bool                        // the downstream stream was reset
	Attempts int                         // upstream attempts made (0: none)
	// Gateway is the virtual host's gateway header; FuseboxRoute the
	// x-fusebox-route response header; FirstByte and Duration are
	// %RESPONSE_DURATION% and %DURATION%.
	Gateway             string
	FuseboxRoute        string
	RequestID           string // the x-request-id Envoy set
	FirstByte, Duration time.Duration
	// RateLimit is what the shipped json_format's ratelimit_* fields log
	// of the response (%RESP(A?B)%: header A, else B; "" when neither):
	// remaining requests, their reset, remaining tokens, their reset.
	RateLimit [4]string
	// timeout is the request's ext_proc message timeout, if any
	// (timeouts.go).
	timeout *TimeoutEvent

	// routeEP is the route role's ext_proc stream, closed as the
	// response headers pass it when its encoding path sends nothing
	// (streamclose.go, atEncodeHeaders).
	routeEP *epStream
}

// rateLimitHeaders are the ratelimit_* fields' %RESP(A?B)% pairs, in
// Entry.RateLimit's order, and rateLimitFields their names.
var (
	rateLimitHeaders = [4][2]string{
		{"x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"},
		{"x-ratelimit-reset-requests", "anthropic-ratelimit-requests-reset"},
		{"x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"},
		{"x-ratelimit-reset-tokens", "anthropic-ratelimit-tokens-reset"},
	}
	rateLimitFields = [4]string{"ratelimit_requests", "ratelimit_requests_reset", "ratelimit_tokens", "ratelimit_tokens_reset"}
)

// FuseboxStage returns the fusebox namespace's fields as strings.
func (e Entry) FuseboxStage() map[string]string {
	out := map[string]string{}
	if st := e.Metadata["fusebox"]; st != nil {
		for k, v := range st.Fields {
			out[k] = v.GetStringValue()
		}
	}
	return out
}
