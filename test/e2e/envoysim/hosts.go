package envoysim

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcCluster is an Envoy cluster of gRPC hosts (the fusebox cluster, which
// compose and Kubernetes fill with every fusebox replica). Envoy's gRPC
// async client starts each stream as a request through the cluster's load
// balancer, so with the default ROUND_ROBIN policy every new stream — an
// ext_proc stream per request or attempt, an access log stream per worker —
// goes to the next host (docs/envoy.md, "Several fusebox replicas").
type grpcCluster struct {
	conns []*grpc.ClientConn
	next  atomic.Uint64
}

// hosts returns the cluster's endpoints: addr first, then more.
func hosts(addr string, more []string) []string {
	out := []string{}
	if addr != "" {
		out = append(out, addr)
	}
	return append(out, more...)
}

// grpcClusters shares one connection per address among the proxy's
// clusters (the route role, the attempt role and the access logger all
// name the fusebox cluster).
type grpcClusters struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	// byHosts: filters that name the same hosts name the same Envoy
	// cluster, so they share one load balancer's rotation.
	byHosts map[string]*grpcCluster
}

// cluster returns the cluster of addrs. Its connections advertise the
// windows Envoy's HTTP/2 codec does: window for each stream (the
// cluster's initial_stream_window_size) and connWindow for the connection
// (initial_connection_window_size; the shipped files set none, so the
// release's default): static windows, so grpc-go's BDP estimation, which
// pings once per round trip while data flows, is off. Envoy pings a
// cluster's connection only for connection_keepalive (docs/envoy.md, "No
// PING without connection_keepalive"), and the shipped configs set none.
// The first filter that names an address sets its connection's windows.
func (g *grpcClusters) cluster(addrs []string, window, connWindow int) (*grpcCluster, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns == nil {
		g.conns, g.byHosts = map[string]*grpc.ClientConn{}, map[string]*grpcCluster{}
	}
	key := strings.Join(addrs, ",")
	if c, ok := g.byHosts[key]; ok {
		return c, nil
	}
	c := &grpcCluster{}
	g.byHosts[key] = c
	for _, a := range addrs {
		conn, ok := g.conns[a]
		if !ok {
			var err error
			conn, err = grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithConnectParams(envoyReconnect),
				grpc.WithInitialWindowSize(int32(window)), grpc.WithInitialConnWindowSize(int32(connWindow)))
			if err != nil {
				return nil, err
			}
			g.conns[a] = conn
		}
		c.conns = append(c.conns, conn)
	}
	return c, nil
}

func (g *grpcClusters) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}

// envoyReconnect: Envoy's connection pool has no reconnect back-off. A
// stream that finds no ready connection makes one (conn_pool_base.cc,
// tryCreateNewConnection); if it fails, that stream fails and the next one
// tries again. grpc-go's default back-off (1 s, ×1.6, up to 120 s) would
// keep a restarted fusebox unused for as long again as it was down
// (docs/envoy.md, "Reconnecting to fusebox").
var envoyReconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1, MaxDelay: 10 * time.Millisecond},
	MinConnectTimeout: time.Second,
}

// pick is the round robin choice for one new stream.
func (c *grpcCluster) pick() *grpc.ClientConn {
	n := c.next.Add(1) - 1
	return c.conns[n%uint64(len(c.conns))]
}
