package processor

import (
	"sync"
	"sync/atomic"
)

// reachedClusters is the set of Envoy clusters an access log entry has
// named as its upstream_cluster since this process started: clusters Envoy
// has and reached a host of. A retry's no-host reply to a cluster not in
// it is read as a missing cluster (judge.RetryToUnknownCluster).
//
// Entries come from outside, so the set is bounded: past maxReached names
// it stops growing, and a retry's no-host reply to a cluster left out is
// read as a configuration error, a neither — never a failure. Real
// configs have tens of clusters.
type reachedClusters struct {
	m sync.Map // string → struct{}
	n atomic.Int64
}

const maxReached = 4096

// note adds cluster ("" is no cluster: NC, UH).
func (r *reachedClusters) note(cluster string) {
	if cluster == "" {
		return
	}
	if _, ok := r.m.Load(cluster); ok {
		return
	}
	if r.n.Load() >= maxReached {
		return
	}
	if _, loaded := r.m.LoadOrStore(cluster, struct{}{}); !loaded {
		r.n.Add(1)
	}
}

func (r *reachedClusters) has(cluster string) bool {
	_, ok := r.m.Load(cluster)
	return ok
}
