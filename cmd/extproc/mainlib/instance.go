package mainlib

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/admin"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/processor"
	"github.com/fusebox-llm/fusebox/pkg/processor/grpcwire"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/tlsfiles"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// Instance is a running fusebox.
type Instance struct {
	Log     *slog.Logger
	Metrics *metrics.Metrics
	Config  *routes.Holder
	Health  *admin.Health
	Store   breaker.Store
	Clock   breaker.Clock
	stopClk func()

	grpcLn, adminLn net.Listener
	grpcSrv         grpcServer
	httpSrv         *http.Server
	grace           time.Duration
	ctx             context.Context
	cancelBg        context.CancelFunc
	bg              sync.WaitGroup
	serveErr        chan error
	proc            *processor.Server
}

// DecisionsKept is how many decisions the processor still holds in memory
// (processor.Server.DecisionsKept): the soak waits for it to reach 0
// before it measures what a load left behind.
func (in *Instance) DecisionsKept() int {
	if in.proc == nil {
		return 0
	}
	return in.proc.DecisionsKept()
}

// GRPCAddr is the ext_proc listener's address.
// A Unix socket is named unix:///path, as gRPC clients dial it.
func (in *Instance) GRPCAddr() string { return dialTarget(in.grpcLn.Addr()) }

// AdminAddr is the admin listener's address.
func (in *Instance) AdminAddr() string { return in.adminLn.Addr().String() }

// Option changes how Start wires fusebox (tests and the demo).
type Option func(*options)

type options struct {
	clock     breaker.Clock
	testClock bool
}

// WithClock makes fusebox read time from c (a fake clock in tests). On
// the Redis store the scripts take c's time as theirs too
// (redisstore.Options.TestClock): a fake clock stands in Redis.
func WithClock(c breaker.Clock) Option { return func(o *options) { o.clock, o.testClock = c, true } }

// WithSkewedClock makes fusebox read time from c, a real clock that is off
// (a replica whose clock drifted): Redis's scripts still run on Redis's
// own clock, as in production.
func WithSkewedClock(c breaker.Clock) Option {
	return func(o *options) { o.clock, o.testClock = c, false }
}

// Start loads the config, opens both listeners and starts serving. It
// returns once fusebox is serving; Wait blocks until ctx ends and the drain
// is over.
func Start(ctx context.Context, args []string, stderr io.Writer, opts ...Option) (*Instance, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	f, err := parseFlags(args, stderr)
	if err != nil {
		return nil, err
	}
	log := newLogger(f, stderr)
	data, err := routes.ReadFile(f.Config)
	if err != nil {
		return nil, err
	}
	fileRT, err := routes.Parse(data, routes.Options{})
	if err != nil {
		return nil, err
	}
	// The file's own start-only settings, before the flags override them:
	// a reload compares the file with the file, and keeps what is in force.
	fileSettings := routes.StartSettingsOf(fileRT)
	if f.RedisURL != "" {
		fileRT.Store.Redis.URL = f.RedisURL
	}
	switch {
	case f.RedisFlag && fileRT.Store.Backend != routes.StoreRedis:
		// Asking for a Redis URL on the command line is asking for Redis:
		// running on memory instead was a silent split brain.
		log.Info("-redis-url selects store.backend redis (the file says " + fileRT.Store.Backend + ")")
		fileRT.Store.Backend = routes.StoreRedis
	case f.RedisURL != "" && fileRT.Store.Backend != routes.StoreRedis:
		log.Warn("FUSEBOX_REDIS_URL is set but store.backend is " + fileRT.Store.Backend + ": fusebox runs on " + fileRT.Store.Backend + "; set store.backend: redis to share state")
	}
	// After the flags: the store they select is the one checked.
	if problems := startProblems(fileRT); len(problems) > 0 {
		return nil, &routes.ConfigError{Problems: problems}
	}
	in := &Instance{
		Log:      log,
		Metrics:  metrics.New(),
		Health:   admin.NewHealth("config", "listeners", "store"),
		grace:    f.GracePeriod,
		ctx:      ctx,
		serveErr: make(chan error, 2),
	}
	in.Clock, in.stopClk = o.clock, func() {}
	if in.Clock == nil {
		cc := breaker.NewCoarseClock(time.Millisecond)
		in.Clock, in.stopClk = cc, cc.Stop
	}
	journal := breaker.NewJournal(256)
	// Named by host (a pod's name) and a random part (two replicas on one
	// host): the fleet's timeline says which replica made each transition.
	if host, err := os.Hostname(); err == nil {
		journal.SetReplica(host + "-" + journal.Replica())
	}
	reporter := &processor.EventReporter{Log: log, Metrics: in.Metrics, Journal: journal}
	// The store, and where admin changes are kept: a file beside the
	// memory store, Redis beside the Redis one (R-API2a).
	// Another replica changed an overlay: load them all again, off the
	// feed reader (it must never wait on an admin change: R-L11).
	refresher := &routes.Refresher{OnError: func(err error) {
		log.Error("[config] reloading the admin changes from the shared store failed; the next change or resync retries", "error", err.Error())
	}}
	sw, err := openStore(fileRT.Store, log, in.Metrics, in.Health, reporter, in.Clock, o.testClock, func(string) { refresher.Notify() })
	if err != nil {
		in.stopClk()
		return nil, err
	}
	in.Store = sw.store
	// The fleet's transitions are kept in the store (R-API7: replica B
	// behind a Service shows what replica A did).
	fleetJournal, _ := sw.store.(breaker.FleetJournal)
	reporter.SetFleet(fleetJournal)
	// The effective config: the file overlaid by admin changes (R-API2a).
	mgr := &routes.Manager{Store: sw.overlays, Log: log, SharedStore: sw.shared}
	refresher.Manager = mgr
	if sw.shared {
		refresher.Every = 5 * time.Second // the periodic overlay check (R-ST9)
	}
	rt, err := mgr.Open(ctx, data)
	if err != nil {
		in.stopClk()
		sw.close()
		return nil, err
	}
	if f.GRPCAddr != "" {
		rt.Listen.GRPC = f.GRPCAddr
	}
	if f.AdminAddr != "" {
		rt.Listen.Admin = f.AdminAddr
	}
	rt.Store.Redis.URL, rt.Store.Backend = fileRT.Store.Redis.URL, fileRT.Store.Backend
	in.Config = routes.NewHolder(rt)
	in.Health.Set("config", admin.Component{Ready: true, Detail: nameOr(f.Config)})

	reloader := &routes.Reloader{
		Path: f.Config, Holder: in.Config, Log: log, Started: &fileSettings, Manager: mgr, MaxBytes: rt.Limits.MaxConfigBytes,
		OnResult:      func(r string) { in.Metrics.ConfigReloads.WithLabelValues(r).Inc() },
		OnFallback:    func(routes.Fallback) { in.Metrics.ConfigFallbacks.Inc() },
		OnRefusedRead: func() { in.Metrics.Refused.WithLabelValues(metrics.RefusedConfigFile).Inc() },
	}
	mgr.Holder, mgr.Report = in.Config, reloader.Report
	reloader.Report(rt)

	history := breaker.NewHistory()
	if rt.Store.Backend == routes.StoreMemory && rt.Store.Memory.PersistPath == "" {
		log.Warn("store.memory.persist_path is empty: admin changes are not kept across restarts")
	}

	if in.grpcLn, err = listenGRPC(rt.Listen.GRPC, rt.Listen.GRPCSocket); err != nil {
		return nil, fmt.Errorf("listen.grpc: %w", err)
	}
	if in.adminLn, err = net.Listen("tcp", rt.Listen.Admin); err != nil {
		in.grpcLn.Close()
		return nil, fmt.Errorf("listen.admin: %w", err)
	}
	grpcTLS, adminTLS, err := listenerTLS(rt, log)
	if err != nil {
		in.grpcLn.Close()
		in.adminLn.Close()
		return nil, err
	}
	if adminTLS != nil {
		in.adminLn = tls.NewListener(in.adminLn, adminTLS)
	}
	if grpcTLS == nil && !admin.IsLoopbackAddr(in.grpcLn.Addr()) {
		log.Warn("listen.grpc is not loopback and listen.tls is not set: anyone who reaches it can report outcomes; bind it to loopback or set listen.tls with client_ca_file",
			"addr", in.GRPCAddr())
	}

	// gRPC: ext_proc plus grpc.health.v1, which follows the readiness.
	in.grpcSrv = newGRPCServer(f.GRPCServer, rt.Limits, grpcTLS)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(in.grpcSrv, hs)
	procSrv := processor.NewServer(processor.Options{
		Config: in.Config, Store: in.Store, Clock: in.Clock, Metrics: in.Metrics, Log: log,
		MaxStreams: rt.Limits.MaxConcurrentStreams, History: history, TokenKey: sw.fleetKey, Journal: journal,
		StreamIdle: rt.Limits.MaxStreamIdle, StreamDuration: rt.Limits.MaxStreamDuration,
		OnAccessLogStreams: func(n int64) {
			detail := "not connected"
			if n > 0 {
				detail = fmt.Sprintf("connected (%d streams)", n)
			}
			// Informational (R-AL6): fusebox serves without the channel.
			in.Health.Set("access_log", admin.Component{Ready: true, Detail: detail})
		},
		OnMismatch: func(what, help string) {
			// Still ready (traffic flows), and the details say what is off.
			in.Health.Set("deployment", admin.Component{Ready: true, Degraded: true, Detail: what + ": " + help})
		},
	})
	in.proc = procSrv
	extprocv3.RegisterExternalProcessorServer(in.grpcSrv, procSrv)
	// The access log channel (SPEC §4a) on the same listener, TLS and limits.
	accesslogv3.RegisterAccessLogServiceServer(in.grpcSrv, procSrv.AccessLogService())
	in.Health.Set("access_log", admin.Component{Ready: true, Detail: "not connected"})
	in.Health.OnChange(func(serving bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if serving {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus("", st)
		hs.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, st)
	})

	// Admin HTTP.
	// A token read from a secret file often ends with a newline; it could
	// never match (R-L4).
	token := strings.TrimSpace(os.Getenv(rt.Admin.TokenEnv))
	auth := admin.Auth{Token: token, Loopback: admin.IsLoopbackAddr(in.adminLn.Addr()), Log: log,
		Refused: func(what string) { in.Metrics.Refused.WithLabelValues(what).Inc() }}
	switch {
	case token == "" && !auth.Loopback:
		log.Warn("[admin] no token is set ("+rt.Admin.TokenEnv+") and the admin listener is not loopback: /admin/v1 answers 403",
			"addr", in.AdminAddr())
	case token != "" && len(token) < 16:
		log.Warn("[admin] the admin token is shorter than 16 bytes: use a long random one", "token_env", rt.Admin.TokenEnv)
	}
	adm := admin.NewServer(in.Health, in.Metrics.Registry, auth)
	api := &admin.API{Config: in.Config, Store: in.Store, Clock: in.Clock, Log: log, History: history, Baseline: procSrv.LatencyBaselineMs, Journal: journal,
		FleetJournal: fleetJournal}
	api.Register(adm)
	(&admin.Gateways{Manager: mgr, API: api, Refused: func(what string) { in.Metrics.Refused.WithLabelValues(what).Inc() }}).Register(adm)
	adm.RegisterDashboard()
	in.httpSrv = adminHTTPServer(adm)

	bgCtx, cancel := context.WithCancel(context.Background())
	in.cancelBg = cancel
	// The store runs before anything is served: a stream's record must
	// find its workers.
	if sw.start != nil {
		wg := sw.start(bgCtx)
		in.bg.Add(1)
		go func() { defer in.bg.Done(); wg.Wait(); sw.close() }()
	}
	go func() { in.serveErr <- in.grpcSrv.Serve(in.grpcLn) }()
	go func() {
		if err := in.httpSrv.Serve(in.adminLn); !errors.Is(err, http.ErrServerClosed) {
			in.serveErr <- err
		}
	}()
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		procSrv.RunStallWatch(bgCtx, 250*time.Millisecond)
	}()
	in.bg.Add(1)
	go func() { defer in.bg.Done(); refresher.Run(bgCtx) }()
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		breaker.RunSweeper(bgCtx, in.Store, in.Clock, 250*time.Millisecond, func(error) {
			in.Metrics.StoreErrors.WithLabelValues("sweep").Inc()
		})
	}()
	guardSIGHUP()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if f.Config != "" {
		reloader.Prime()
	}
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		defer signal.Stop(hup)
		if f.Config != "" {
			reloader.Run(bgCtx, f.ReloadInterval, hup)
			return
		}
		// Nothing to reload: a SIGHUP (a config-reload sidecar, a
		// terminal that closed) is said and otherwise ignored.
		for {
			select {
			case <-bgCtx.Done():
				return
			case <-hup:
				log.Info("[config] SIGHUP: there is no config file to reload (the embedded default config is in force)")
			}
		}
	}()
	in.Health.Set("listeners", admin.Component{Ready: true, Detail: "grpc " + in.GRPCAddr() + ", admin " + in.AdminAddr()})
	if sw.start == nil {
		in.Health.Set("store", admin.Component{Ready: true, Detail: rt.Store.Backend})
	}
	log.Info("fusebox serving", "grpc", in.GRPCAddr(), "admin", in.AdminAddr(), "config", nameOr(f.Config),
		"gateways", len(rt.Gateways), "store", rt.Store.Backend, "version", versionString(), "collector", collectorSettings())
	return in, nil
}

// guardSIGHUP keeps a SIGHUP from ever ending the process once fusebox has
// started: Go's default for it is to exit, and it is back in force
// whenever no channel is registered for it, as between one instance's stop
// and the next one's start (a test process, an in-process restart).
// Before, fusebox on its embedded default config registered none, and a
// SIGHUP (a config-reload sidecar, a closed terminal) killed it. This one
// registration is never stopped and never read: a signal it gets is
// dropped, and the instances' own channels get theirs as before.
func guardSIGHUP() {
	hupGuard.Do(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP) })
}

var hupGuard sync.Once

// adminHTTPServer bounds what one admin client can hold (R-L6): idle
// keep-alive connections close after a minute, slow requests and slow
// readers are cut.
func adminHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}

// grpcOptions are the ext_proc listener's limits (R-L1, R-L6): the largest
// message Envoy's config can send, a bound on streams per connection,
// keepalive enforcement and closing idle connections.
// grpcServer is what the ext_proc listener's server does: grpc-go's
// *grpc.Server or processor/grpcwire's *Server.
type grpcServer interface {
	grpc.ServiceRegistrar
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

// newGRPCServer builds the ext_proc listener's server (-grpc-server): the
// same limits, keepalive and codec on either.
func newGRPCServer(which string, l routes.Limits, tlsCfg *tls.Config) grpcServer {
	if which == "grpc-go" {
		var creds credentials.TransportCredentials
		if tlsCfg != nil {
			creds = credentials.NewTLS(tlsCfg)
		}
		return grpc.NewServer(grpcOptions(l, creds)...)
	}
	return grpcwire.NewServer(grpcwire.Options{
		Codec:                processor.Codec{},
		MaxRecvMsgSize:       l.MaxMessageBytes,
		MaxRecvMsgSizeFor:    processor.RecvBounds(),
		MaxConcurrentStreams: connStreams(l.MaxConcurrentStreams),
		StreamWindow:         processor.StreamWindow,
		ConnWindow:           processor.ConnWindow,
		TLS:                  tlsCfg,
		PingMinTime:          10 * time.Second,
		KeepaliveTime:        time.Minute,
		KeepaliveTimeout:     20 * time.Second,
		MaxConnectionIdle:    5 * time.Minute,
		OnAcceptError:        acceptErrorLog(),
	})
}

// connStreams is the streams one connection may have open at once: an
// eighth of limits.max_concurrent_streams (the process-wide bound, which
// the processor enforces), at least 64 or the whole bound when it is
// smaller. Envoy opens one connection to fusebox per worker, so one
// connection never needs the whole budget; before, the per-connection and
// the process-wide limits were one number, and one connection that opened
// 100,000 streams took them all (164 of 260 legitimate calls refused, and
// Envoy then let traffic through without fusebox).
func connStreams(total int) uint32 {
	return uint32(min(max(total/8, min(total, 64)), math.MaxUint32))
}

// acceptErrorLog logs the accept errors the listener backs off from
// (descriptors or buffers ran out), at most once every 10 s with how many
// there were: the listener keeps accepting, and the log must not flood.
func acceptErrorLog() func(error) {
	var mu sync.Mutex
	var last time.Time
	n := 0
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if time.Since(last) < 10*time.Second {
			return
		}
		slog.Error("the ext_proc listener could not accept a connection; it backs off and keeps accepting (raise the descriptor limit?)",
			"error", err.Error(), "errors", n)
		last, n = time.Now(), 0
	}
}

// maxHeaderListSize bounds a stream's request headers on grpc-go's server.
const maxHeaderListSize = 64 << 10

func grpcOptions(l routes.Limits, creds credentials.TransportCredentials) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.MaxMessageBytes),
		grpc.MaxConcurrentStreams(connStreams(l.MaxConcurrentStreams)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute, Time: time.Minute, Timeout: 20 * time.Second}),
		// proto, without the metadata Envoy repeats on every body message
		// (processor/codec.go).
		grpc.ForceServerCodecV2(processor.Codec{}),
		// An ext_proc stream's request headers are a few short fields (the
		// HTTP request travels in its messages); grpc-go decodes and keeps
		// every header of a stream, -bin ones included, so a 16 MiB list
		// let an HPACK bomb of 200 streams hold 258 MiB (the attack kit).
		grpc.MaxHeaderListSize(maxHeaderListSize),
	}
	opts = append(opts, processor.TransportOptions()...)
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	return opts
}

// listenerTLS builds the listeners' TLS from listen.tls (R-L5): the same
// certificate on both, client certificates required on ext_proc when a
// client CA is set. The files are re-read when they change.
func listenerTLS(rt *routes.Runtime, log *slog.Logger) (*tls.Config, *tls.Config, error) {
	t := rt.Listen.TLS
	if t.CertFile == "" {
		return nil, nil, nil
	}
	src := &tlsfiles.Source{CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile,
		OnReload: func(err error) {
			if err != nil {
				log.Error("[tls] re-reading the certificate files failed; the last good ones stay in use", "error", err)
				return
			}
			log.Info("[tls] certificate files re-read")
		}}
	if err := src.Load(); err != nil {
		return nil, nil, err
	}
	return src.ServerConfig(true, "h2"), src.ServerConfig(false, "http/1.1"), nil
}

// startProblems are what start-up refuses beyond the config's own
// validation; `validate` reports them too (R-P10: a config that validates
// also starts).
func startProblems(rt *routes.Runtime) []string {
	var out []string
	if rt.Store.Backend == routes.StoreRedis {
		if c, err := redisstore.NewClient(rt.Store.Redis.URL); err != nil {
			out = append(out, err.Error())
		} else {
			_ = c.Close()
		}
		if f := rt.Store.Redis.HMACKeyFile; f != "" {
			if _, err := redisstore.ReadKeyFile(f); err != nil {
				out = append(out, err.Error())
			}
		} else if rt.Envoy.Failover {
			// R-X10: each replica opens the attempt tokens the others
			// seal, so they must share a key.
			out = append(out, "envoy.failover with store.backend redis needs store.redis.hmac_key_file: every replica must open the attempt tokens the others seal (a fleet key)")
		}
	}
	return out
}

// Wait blocks until the context ends (SIGTERM), then drains: health reports
// not serving while streams keep being served for the grace period, then the
// servers stop and Wait returns nil.
func (in *Instance) Wait() error {
	var err error
	select {
	case <-in.ctx.Done():
	case err = <-in.serveErr:
		in.Log.Error("a listener failed", "error", err)
	}
	in.Health.Drain()
	if err == nil {
		in.Log.Info("draining: reporting not serving, still serving", "grace_period", in.grace.String())
		select {
		case <-time.After(in.grace):
		case err = <-in.serveErr:
		}
	}
	defer in.stopClk()
	// gRPC first: once its streams are done nothing records any more; then
	// the background work stops, and the store's record workers write what
	// is still queued (R-ST8) before the process ends.
	stopped := make(chan struct{})
	go func() { in.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		in.grpcSrv.Stop()
	}
	in.cancelBg()
	in.bg.Wait()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = in.httpSrv.Shutdown(sctx)
	in.Log.Info("fusebox stopped")
	return err
}
