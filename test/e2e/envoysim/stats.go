package envoysim

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// Stats are the operator-visible counters of ENVOY.md, by name
// (streams_started, spurious_msgs_received, failure_mode_allowed,
// message_timeouts, rejected_header_mutations, clear_route_cache_ignored,
// upstream_rq_retry, no_cluster, upstream_rq_timeout, …).
type Stats struct {
	mu sync.Mutex
	m  map[string]int
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
}

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
