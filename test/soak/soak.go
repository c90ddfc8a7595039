package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fusebox-llm/fusebox/cmd/extproc/mainlib"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
	"github.com/fusebox-llm/fusebox/test/e2e/fakeprovider"
	"github.com/fusebox-llm/fusebox/test/e2e/logbuf"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
)

// Markers put into every prompt, and that every answer carries: no log line
// may contain either.
const (
	promptMarker     = "SOAK-PROMPT-MARKER-7f3a"
	completionMarker = "Hello from"
)

// Options of a run.
type Options struct {
	Requests    int
	Concurrency int
	// Rate paces the load (requests per second, all clients together);
	// 0 = as fast as the clients go.
	Rate   int
	Faults bool
	// FaultEvery is the pause between two steps of the fault schedule.
	FaultEvery time.Duration
	EnvoyYAML  string // the shipped Envoy config the proxy is built from
	// Envoy is the release the proxy plays (envoysim.Version; zero: the
	// current one). On 1.36 with envoy.yaml the route role never sees
	// Envoy's local replies: only the access log channel counts them.
	Envoy envoysim.Version
	Log   io.Writer
	// WarmupFaults runs the fault schedule once during the warm-up, before
	// the baseline is taken.
	WarmupFaults bool
	// Redis runs fusebox on the Redis store (a redis-server the campaign
	// starts), and adds Redis killed and restarted to the schedule.
	Redis bool
	// Replicas is how many fusebox processes serve behind the one proxy
	// (0 or 1: one); more than one needs Redis. Envoy's round robin sends
	// each ext_proc stream, and each access log worker's stream, to the
	// next replica. Only the first one is restarted by the schedule.
	Replicas int
	// RedisFaults puts fusebox's Redis behind a fault proxy and adds to the
	// schedule: a 2 s stall, 5 ms per direction of slowness, FLUSHALL.
	RedisFaults bool
	// Skew runs the second replica on a clock that many ahead.
	Skew time.Duration
}

// skewed is a replica's clock, off by a constant.
type skewed struct{ d time.Duration }

func (c skewed) Now() time.Time { return time.Now().Add(c.d) }

// extraReplica is a fusebox of the fleet after the first.
type extraReplica struct {
	grpcAddr string
	in       *mainlib.Instance
	stop     context.CancelFunc
}

var routeProviders = []string{"openai_us", "azure_eu", "openai_eu", "anthropic_us", "anthropic_eu"}

// primaryProviders serve each model's first route: the faults go there.
var primaryProviders = []string{"openai_us", "anthropic_us"}

const configTemplate = `
listen: {grpc: %s, admin: %s}
store: %s
policies:
  soak: {enabled: true, failure_threshold: %d, window_sec: 10, cooldown_ms: 2000, probe_timeout_ms: 3000, half_open_max_probes: 2}
gateways:
  - id: default
    circuit_breaker: {policy: soak}
    models:
      - name: gpt-4o-mini
        routes: [openai:us-east:gpt-4o-mini, azure:eu-west:gpt-4o-mini, openai:eu:gpt-4o-mini]
      - name: claude
        routes: [anthropic:us:claude, anthropic:eu:claude]
    routes:
      - {key: openai:us-east:gpt-4o-mini, cluster: openai_us}
      - {key: azure:eu-west:gpt-4o-mini, cluster: azure_eu}
      - {key: openai:eu:gpt-4o-mini, cluster: openai_eu}
      - {key: anthropic:us:claude, cluster: anthropic_us, api: anthropic}
      - {key: anthropic:eu:claude, cluster: anthropic_eu, api: anthropic}
`

var routeOf = map[string]string{
	"openai_us": "openai:us-east:gpt-4o-mini", "azure_eu": "azure:eu-west:gpt-4o-mini", "openai_eu": "openai:eu:gpt-4o-mini",
	"anthropic_us": "anthropic:us:claude", "anthropic_eu": "anthropic:eu:claude",
}

// rig is the system under test.
type rig struct {
	// stopped, collected: instances stopped (fusebox_restart) and how many
	// of their stores the collector has freed since (a finalizer): one
	// still held after the load is a stopped fusebox kept alive.
	stopped, collected atomic.Int64
	opts               Options
	providers          map[string]*fakeprovider.Provider
	proxy              *envoysim.Proxy
	cfgPath            string
	grpcAddr           string
	adminAddr          string
	logs               *logbuf.Buffer

	mu        sync.Mutex
	fusebox   *mainlib.Instance
	stop      context.CancelFunc
	gathered  folded // the metrics of every stopped instance (gathered.go)
	threshold int
	redis     *redistest.Server // nil: the memory store
	// rproxy stands between fusebox and Redis (RedisFaults); rdb talks to
	// Redis directly (FLUSHALL).
	rproxy   *redistest.Proxy
	rdb      *redis.Client
	extra    []*extraReplica
	profiles int

	// The load can be paused (to kill fusebox with nothing in flight).
	gate     sync.RWMutex
	inflight atomic.Int64
	// epoch grows when the run throws breaker state away on purpose (a
	// fusebox restart on the memory store, Redis restarted or flushed):
	// the failure-count invariant does not compare across it.
	epoch  atomic.Int64
	counts failCounts // the failure-count invariant's samples (failcount.go)
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func newRig(opts Options, dir string) (*rig, error) {
	r := &rig{opts: opts, providers: map[string]*fakeprovider.Provider{}, logs: &logbuf.Buffer{}, threshold: 3,
		cfgPath: filepath.Join(dir, "fusebox.yaml"), grpcAddr: freeAddr(), adminAddr: freeAddr()}
	if opts.Redis {
		srv, err := redistest.Launch(dir)
		if err != nil {
			return nil, fmt.Errorf("redis-server: %w", err)
		}
		r.redis = srv
		r.rdb = redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		if opts.RedisFaults {
			if r.rproxy, err = redistest.NewProxy(srv.Addr); err != nil {
				return nil, err
			}
		}
	}
	for _, n := range append(routeProviders, "fallback") {
		p, err := fakeprovider.Start(n)
		if err != nil {
			return nil, err
		}
		r.providers[n] = p
	}
	if err := r.writeConfig(dir); err != nil {
		return nil, err
	}
	if err := r.startFusebox(); err != nil {
		return nil, err
	}
	for i := 1; i < opts.Replicas; i++ {
		if err := r.startReplica(i); err != nil {
			return nil, err
		}
	}
	b, err := envoyconfig.Load(opts.EnvoyYAML)
	if err != nil {
		return nil, err
	}
	cfg, err := envoyconfig.Harness(b)
	if err != nil {
		return nil, err
	}
	cfg.Gateway = "default"
	cfg.Envoy = opts.Envoy
	cfg.ExtProc.Addr = r.grpcAddr
	if cfg.Observer != nil {
		cfg.Observer.Addr = r.grpcAddr
	}
	if cfg.AccessLog != nil {
		cfg.AccessLog.Addr = r.grpcAddr
	}
	for _, x := range r.extra {
		cfg.ExtProc.Addrs = append(cfg.ExtProc.Addrs, x.grpcAddr)
		if cfg.Observer != nil {
			cfg.Observer.Addrs = append(cfg.Observer.Addrs, x.grpcAddr)
		}
		if cfg.AccessLog != nil {
			cfg.AccessLog.Addrs = append(cfg.AccessLog.Addrs, x.grpcAddr)
			cfg.AccessLog.Workers = 2
		}
	}
	cfg.Clusters = map[string]*envoysim.Cluster{}
	for n, p := range r.providers {
		cfg.Clusters[n] = &envoysim.Cluster{Addr: p.Addr(), MaxRequests: 4096}
	}
	cfg.ServeDefaultsFrom(envoysim.Cluster{Addr: r.providers["fallback"].Addr(), MaxRequests: 4096})
	if r.proxy, err = envoysim.New(cfg); err != nil {
		return nil, err
	}
	if err := r.proxy.Start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rig) writeConfig(dir string) error {
	store := fmt.Sprintf("{memory: {persist_path: %q}}", filepath.Join(dir, "overlays.json"))
	if r.redis != nil {
		addr := r.redis.Addr
		if r.rproxy != nil {
			addr = r.rproxy.Addr
		}
		store = fmt.Sprintf("{backend: redis, redis: {url: %q, key_prefix: \"soak:\"}}", "redis://"+addr+"/0")
	}
	doc := fmt.Sprintf(configTemplate, r.grpcAddr, r.adminAddr, store, r.threshold)
	if r.observer() {
		// The observer profile (#28): fusebox must know the deployment.
		doc = "envoy: {observer: true}\n" + doc
	}
	tmp := r.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.cfgPath)
}

func (r *rig) startFusebox() error {
	ctx, cancel := context.WithCancel(context.Background())
	in, err := mainlib.Start(ctx, []string{"-config", r.cfgPath, "-grace-period", "0s", "-reload-interval", "500ms"}, r.logs, mainlib.WithOverlayCache(""))
	if err != nil {
		cancel()
		return err
	}
	r.mu.Lock()
	r.fusebox, r.stop = in, cancel
	r.mu.Unlock()
	r.logs.Write([]byte("=== fusebox started\n"))
	return nil
}

// startReplica starts fusebox replica i (> 0) on the same config, its own
// listeners, and (i == 1) the skewed clock.
func (r *rig) startReplica(i int) error {
	x := &extraReplica{grpcAddr: freeAddr()}
	ctx, cancel := context.WithCancel(context.Background())
	var opts []mainlib.Option
	if i == 1 && r.opts.Skew != 0 {
		opts = append(opts, mainlib.WithSkewedClock(skewed{r.opts.Skew}))
	}
	in, err := mainlib.Start(ctx, []string{"-config", r.cfgPath, "-grace-period", "0s", "-reload-interval", "500ms",
		"-grpc-addr", x.grpcAddr, "-admin-addr", freeAddr()}, r.logs.Prefixed(fmt.Sprintf("[r%d] ", i)), append(opts, mainlib.WithOverlayCache(""))...)
	if err != nil {
		cancel()
		return err
	}
	x.in, x.stop = in, cancel
	r.extra = append(r.extra, x)
	return nil
}

func (r *rig) stopFusebox() {
	r.mu.Lock()
	in, stop := r.fusebox, r.stop
	r.fusebox = nil
	r.mu.Unlock()
	if in != nil {
		stop()
		_ = in.Wait()
		if st, ok := in.Store.(*redisstore.Store); ok {
			r.stopped.Add(1)
			runtime.AddCleanup(st, func(c *atomic.Int64) { c.Add(1) }, &r.collected)
		}
		// Keep the metrics the checks read, not the instance.
		if fams, err := in.Metrics.Registry.Gather(); err == nil {
			var keep []*dto.MetricFamily
			for _, f := range fams {
				switch f.GetName() {
				case "aig_circuit_breaker_outcomes_total", "aig_extproc_message_duration_seconds", "aig_config_reloads_total", "aig_store_errors_total",
					"aig_circuit_breaker_decisions_total":
					keep = append(keep, f)
				}
			}
			r.mu.Lock()
			r.gathered.fold(keep)
			r.mu.Unlock()
		}
	}
}

func (r *rig) close() {
	if r.proxy != nil {
		r.proxy.Close()
	}
	r.stopFusebox()
	for _, x := range r.extra {
		x.stop()
		_ = x.in.Wait()
	}
	if r.rproxy != nil {
		r.rproxy.Close()
	}
	if r.rdb != nil {
		r.rdb.Close()
	}
	for _, p := range r.providers {
		p.Close()
	}
	if r.redis != nil {
		r.redis.Stop()
	}
}

// request is one client request of the mix.
func (r *rig) request(i int) (status int, err error) {
	var path, body string
	stream := i%2 == 0
	switch i % 3 {
	case 0:
		path, body = "/v1/chat/completions", fmt.Sprintf(`{"model":"gpt-4o-mini","stream":%v,"messages":[{"role":"user","content":"%s %d"}]}`, stream, promptMarker, i)
	case 1:
		path, body = "/v1/responses", fmt.Sprintf(`{"model":"gpt-4o-mini","stream":%v,"input":"%s %d"}`, stream, promptMarker, i)
	default:
		path, body = "/v1/messages", fmt.Sprintf(`{"model":"claude","stream":%v,"max_tokens":64,"messages":[{"role":"user","content":"%s %d"}]}`, stream, promptMarker, i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", r.proxy.URL()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return 0, errHung
		}
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return resp.StatusCode, errHung
	}
	return resp.StatusCode, nil
}

var errHung = errors.New("no answer within its deadline")

// gatherAll merges every fusebox lifetime's metric families by name.
func (r *rig) gatherAll() map[string][]*dto.MetricFamily {
	r.mu.Lock()
	all := [][]*dto.MetricFamily{r.gathered.families()}
	in := r.fusebox
	r.mu.Unlock()
	if in != nil {
		if fams, err := in.Metrics.Registry.Gather(); err == nil {
			all = append(all, fams)
		}
	}
	for _, x := range r.extra {
		if fams, err := x.in.Metrics.Registry.Gather(); err == nil {
			all = append(all, fams)
		}
	}
	out := map[string][]*dto.MetricFamily{}
	for _, fams := range all {
		for _, f := range fams {
			out[f.GetName()] = append(out[f.GetName()], f)
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// memory is the process's resident set, from /proc/self/statm.
func memory() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, rss int64
	fmt.Sscan(string(b), &size, &rss)
	return rss * int64(os.Getpagesize())
}

// observer says whether the run drives the observer profile
// (envoy/envoy-observer.yaml), where fusebox only watches: its config
// must say so, and a decision Envoy never placed waits past the run.
func (r *rig) observer() bool {
	return strings.Contains(r.opts.EnvoyYAML, "envoy-observer")
}

// settle closes idle keep-alive connections (pools are not fusebox's
// state), collects garbage and returns goroutines (all, and fusebox's own),
// RSS and the live heap.
// point is one measuring point (settle).
type point struct {
	goroutines, own int
	// serving are fusebox's goroutines serving an access log stream, and
	// logStreams the streams envoysim holds open (goroutines.go).
	serving, logStreams int
	rss, heap           int64
	// pool is what the Redis connections' buffers take (redisConns): a
	// pool's size, which follows the load (up to pool_size while it runs,
	// IdleConns after), not fusebox's state; idle the most conns a
	// replica's pool held.
	pool      int64
	poolConns []int
	// decisions: what the replicas' decision tables still held when the
	// measure was taken (processor.Server.DecisionsKept); waiting: how
	// many of them message timeouts explain, each held for
	// decision_wait_sec (waitingPastTheRun).
	decisions, waiting int
	// keys: what the stores' record keys hold (recordKeys).
	keys int64
	// sites: the live heap by allocation site (heapSites).
	sites map[string]int64
}

func (r *rig) settle() point {
	http.DefaultClient.CloseIdleConnections()
	r.proxy.CloseIdleConnections()
	// And the access log streams, which Envoy keeps open: the server's
	// buffers for one are a connection's, not what the load left. Since
	// envoysim sends the DC entry of a client gone mid-answer, as Envoy
	// does, the observer soak opens one, and measured 5.41 -> 6.11 MiB
	// with it open and nothing else grown.
	r.proxy.CloseAccessLogStreams()
	// Observer streams the server left open end at envoysim's deferred
	// close (5 s), the decisions' notes at their TTL (the park time and a
	// second), and the decisions each replica remembers for a late access
	// log entry two access_log.wait_ms generations after they settled
	// (processor.Server.DecisionsKept): none is what the load left
	// behind, so the measure waits for all three, and the decisions still
	// kept then are reported (an invariant: 0). Before, a load that ran
	// late on a loaded machine left 1,400 remembered ids in the measure
	// (the observer soak in CI, 5.10 -> 5.64 MiB). A note that made a
	// claim lives a minute (lifecycle's claimsLife: an operation whose
	// answer was lost is sent again while the store is away): since
	// envoysim sends the DC entry of a client gone before the response, as
	// Envoy does, each such decision's note holds the entry's claim, and
	// the observer soak measured 5.39 -> 6.24 MiB with 142 of them left at
	// 15 s. So the wait runs to that life and a little more (75 s).
	r.mu.Lock()
	ins := []*mainlib.Instance{r.fusebox}
	r.mu.Unlock()
	for _, x := range r.extra {
		ins = append(ins, x.in)
	}
	notes := func() int {
		n := 0
		for _, in := range ins {
			if in == nil {
				continue
			}
			if m, ok := in.Store.(interface{ NoteCount() int }); ok {
				n += m.NoteCount()
			}
		}
		return n
	}
	decisions := func() int {
		n := 0
		for _, in := range ins {
			if in != nil {
				n += in.DecisionsKept()
			}
		}
		return n
	}
	waiting := func() int { return waitingPastTheRun(r.proxy.Timeouts(), r.observer()) }
	for deadline := time.Now().Add(75 * time.Second); (r.proxy.ObserversOpen() > 0 || notes() > 0 || decisions() > waiting()) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	kept := decisions()
	time.Sleep(time.Second)
	runtime.GC()
	debug.FreeOSMemory()
	runtime.GC() // the memory profile is as of the last completed cycle
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if dir := os.Getenv("SOAK_PROFILE_DIR"); dir != "" {
		// A heap profile at each settle point (before, then after the
		// load): go tool pprof -base heap-1.pb.gz heap-2.pb.gz shows
		// what the load left behind.
		r.profiles++
		if f, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%d.pb.gz", r.profiles))); err == nil {
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
		// And the goroutines, grouped by stack with their counts.
		if f, err := os.Create(filepath.Join(dir, fmt.Sprintf("goroutines-%d.txt", r.profiles))); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(f, 1)
			f.Close()
		}
	}
	if os.Getenv("SOAK_DEBUG") != "" || os.Getenv("SOAK_PROFILE_DIR") != "" {
		fmt.Fprintf(os.Stderr, "heap live (alloc) %.2f MiB, objects %d; %s\n", float64(ms.HeapAlloc)/(1<<20), ms.HeapObjects, r.backlogs())
	}
	if os.Getenv("SOAK_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "notes %d, observer streams open %d, decisions kept %d\n", notes(), r.proxy.ObserversOpen(), kept)
		fmt.Fprintf(os.Stderr, "heap inuse %.1f MiB, heap sys %.1f MiB, stack %.1f MiB, released %.1f MiB, other sys %.1f MiB, total sys %.1f MiB\n",
			float64(ms.HeapInuse)/(1<<20), float64(ms.HeapSys)/(1<<20), float64(ms.StackSys)/(1<<20), float64(ms.HeapReleased)/(1<<20),
			float64(ms.OtherSys)/(1<<20), float64(ms.Sys)/(1<<20))
	}
	all, own, serving := goroutineCounts()
	// The live heap after a collection: what the process still holds.
	// (HeapInuse counts the free room of every span an object lives in,
	// which a load's fragmentation grows with nothing retained: 8.2 ->
	// 9.9 MiB in use while the live heap went 4.94 -> 5.18 MiB, in the
	// observer soak.)
	pool, conns := r.redisConns()
	return point{goroutines: all, own: own, serving: serving, logStreams: r.proxy.AccessLogStreamsOpen(), rss: memory(), heap: int64(ms.HeapAlloc),
		pool: pool, poolConns: conns, decisions: kept, waiting: waiting(), keys: r.recordKeys(), sites: heapSites()}
}

// instances are the running fusebox instances: the first and the extra
// replicas.
func (r *rig) instances() []*mainlib.Instance {
	r.mu.Lock()
	ins := []*mainlib.Instance{r.fusebox}
	r.mu.Unlock()
	for _, x := range r.extra {
		ins = append(ins, x.in)
	}
	return slices.DeleteFunc(ins, func(in *mainlib.Instance) bool { return in == nil })
}

// backlogs says what each fusebox's Redis store still owes Redis, and
// how many stopped fuseboxes' stores are still held.
func (r *rig) backlogs() string {
	out := []string{fmt.Sprintf("stopped stores still held %d of %d", r.stopped.Load()-r.collected.Load(), r.stopped.Load())}
	for _, in := range r.instances() {
		if b, ok := in.Store.(interface{ Backlog() (int, int, int) }); ok {
			p, u, c := b.Backlog()
			out = append(out, fmt.Sprintf("%d/%d/%d", p, u, c))
		}
	}
	return strings.Join(out, ", ")
}

// recordKeys is what every fusebox's store remembers of record keys
// (R-DL11): each key is kept for its life (at least 10 minutes) whatever
// the traffic does, so what a load recorded is still held after it, by
// design, and bounded (two generations of at most 2^18 keys a breaker).
// Known to the byte (the stores' key tables are 8 bytes a slot and
// nothing else), it is counted apart, as the Redis pools are.
func (r *rig) recordKeys() (bytes int64) {
	for _, in := range r.instances() {
		if k, ok := in.Store.(interface{ RecordKeyBytes() int64 }); ok {
			bytes += k.RecordKeyBytes()
		}
	}
	return bytes
}

// redisConns returns what the Redis connections' buffers take in this
// process, and how many connections each replica's pool holds: each
// fusebox's pool (go-redis's read and write buffers), the harness's own
// client, and the fault proxy's two pipe buffers per connection.
func (r *rig) redisConns() (bytes int64, perReplica []int) {
	for _, in := range r.instances() {
		if p, ok := in.Store.(interface{ PoolBuffers() (int, int64) }); ok {
			n, b := p.PoolBuffers()
			bytes += b
			perReplica = append(perReplica, n)
		}
	}
	if r.rdb != nil {
		o := r.rdb.Options()
		bytes += int64(r.rdb.PoolStats().TotalConns) * int64(o.ReadBufferSize+o.WriteBufferSize)
	}
	if r.rproxy != nil {
		bytes += int64(r.rproxy.Conns()) * 2 * redistest.PipeBuffer
	}
	return bytes, perReplica
}
