package mainlib

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/admin"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/processor"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/transitions"
)

// Start loads the config, opens both listeners and starts serving. It
// returns once fusebox is serving; Wait blocks until ctx ends and the drain
// is over. Each part it starts is a component (components.go), stopped in
// the reverse order by Wait, or at once when Start fails half-way.
func Start(ctx context.Context, args []string, stderr io.Writer, opts ...Option) (*Instance, error) {
	o := options{overlayCache: routes.DefaultOverlayCache}
	for _, opt := range opts {
		opt(&o)
	}
	f, err := parseFlags(args, stderr)
	if err != nil {
		return nil, err
	}
	log := newLogger(f, stderr)
	file, err := readConfigFile(f, log)
	if err != nil {
		return nil, err
	}
	in := newInstance(ctx, f, log, o)
	started := false
	defer func() {
		if !started {
			in.group.stop()
		}
	}()
	w := &wiring{f: f, o: o, file: file}
	if err := in.openState(ctx, w); err != nil {
		return nil, err
	}
	if err := in.listen(w); err != nil {
		return nil, err
	}
	if err := in.startTracing(ctx, w); err != nil {
		return nil, err
	}
	in.buildServers(w)
	if in.tracer != nil {
		w.reporter.Listen(w.proc.OnTransition)
	}
	// The store runs before anything is served: a stream's record must
	// find its workers. The ext_proc server starts last and stops first.
	in.group.add(w.storeWorkers, in.adminServer(), loop("stall watch", func(ctx context.Context) {
		w.proc.RunStallWatch(ctx, 250*time.Millisecond)
	}), loop("overlay refresher", w.refresher.Run), loop("sweeper", func(ctx context.Context) {
		breaker.RunSweeper(ctx, in.Store, in.Clock, 250*time.Millisecond, func(error) {
			in.Metrics.StoreErrors.WithLabelValues("sweep").Inc()
		})
	}), in.reloaderLoop(w), in.grpcServerComponent())
	started = true
	in.Health.Set("listeners", admin.Component{Ready: true, Detail: "grpc " + in.GRPCAddr() + ", admin " + in.AdminAddr()})
	if w.sw.start == nil {
		in.Health.Set("store", admin.Component{Ready: true, Detail: w.rt.Store.Backend})
	}
	log.Info("fusebox serving", "grpc", in.GRPCAddr(), "admin", in.AdminAddr(), "config", nameOr(f.Config),
		"gateways", len(w.rt.Gateways), "store", w.rt.Store.Backend, "version", versionString(), "collector", collectorSettings())
	return in, nil
}

// wiring is what Start's steps hand each other.
type wiring struct {
	f    *Flags
	o    options
	file configFile

	journal      *breaker.Journal
	reporter     *transitions.Reporter
	refresher    *routes.Refresher
	sw           *storeWiring
	storeWorkers component
	fleetJournal breaker.FleetJournal
	mgr          *routes.Manager
	rt           *routes.Runtime
	reloader     *routes.Reloader
	history      *breaker.History
	grpcTLS      *tls.Config
	proc         *processor.Server
}

// configFile is the config file as read, before admin changes.
type configFile struct {
	data []byte
	rt   *routes.Runtime
	// settings are the file's own start-only settings, before the flags
	// override them: a reload compares the file with the file, and keeps
	// what is in force.
	settings routes.StartSettings
}

// readConfigFile reads and validates the config file (or the embedded
// default), with the store the flags select.
func readConfigFile(f *Flags, log *slog.Logger) (configFile, error) {
	data, err := routes.ReadFile(f.Config)
	if err != nil {
		return configFile{}, err
	}
	rt, err := routes.Parse(data, routes.Options{})
	if err != nil {
		return configFile{}, err
	}
	file := configFile{data: data, rt: rt, settings: routes.StartSettingsOf(rt)}
	if f.RedisURL != "" {
		rt.Store.Redis.URL = f.RedisURL
	}
	switch {
	case f.RedisFlag && rt.Store.Backend != routes.StoreRedis:
		// Asking for a Redis URL on the command line is asking for Redis:
		// running on memory instead was a silent split brain.
		log.Info("-redis-url selects store.backend redis (the file says " + rt.Store.Backend + ")")
		rt.Store.Backend = routes.StoreRedis
	case f.RedisURL != "" && rt.Store.Backend != routes.StoreRedis:
		log.Warn("FUSEBOX_REDIS_URL is set but store.backend is " + rt.Store.Backend + ": fusebox runs on " + rt.Store.Backend + "; set store.backend: redis to share state")
	}
	// After the flags: the store they select is the one checked.
	if problems := startProblems(rt); len(problems) > 0 {
		return configFile{}, &routes.ConfigError{Problems: problems}
	}
	return file, nil
}

// newInstance makes the instance with its clock, its first component.
func newInstance(ctx context.Context, f *Flags, log *slog.Logger, o options) *Instance {
	in := &Instance{
		Log:      log,
		Metrics:  metrics.New(),
		Health:   admin.NewHealth("config", "listeners", "store"),
		grace:    f.GracePeriod,
		ctx:      ctx,
		serveErr: make(chan error, 2),
		Clock:    o.clock,
	}
	stop := func() {}
	if in.Clock == nil {
		cc := breaker.NewCoarseClock(time.Millisecond)
		in.Clock, stop = cc, cc.Stop
	}
	in.group.add(component{name: "clock", stop: stop})
	return in
}

// openState opens the store and the effective config: the file overlaid
// by the admin changes kept beside the store (R-API2a).
func (in *Instance) openState(ctx context.Context, w *wiring) error {
	log := in.Log
	w.journal = breaker.NewJournal(256)
	// Named by host (a pod's name) and a random part (two replicas on one
	// host): the fleet's timeline says which replica made each transition.
	if host, err := os.Hostname(); err == nil {
		w.journal.SetReplica(host + "-" + w.journal.Replica())
	}
	w.reporter = &transitions.Reporter{Log: log, Metrics: in.Metrics, Journal: w.journal}
	// Another replica changed an overlay: load them all again, off the
	// feed reader (it must never wait on an admin change: R-L11).
	w.refresher = &routes.Refresher{OnError: func(err error) {
		log.Error("[config] reloading the admin changes from the shared store failed; the next change or resync retries", "error", err.Error())
	}}
	sw, err := openStore(w.file.rt.Store, storeDeps{log: log, m: in.Metrics, h: in.Health, rep: w.reporter, clock: in.Clock, replica: w.journal.Replica(),
		testClock: w.o.testClock, overlayCache: w.o.overlayCache, onOverlay: func(string) { w.refresher.Notify() }})
	if err != nil {
		return err
	}
	w.sw, in.Store = sw, sw.store
	in.group.add(component{name: "store", stop: sw.close})
	w.storeWorkers = storeWorkers(sw)
	// The fleet's transitions are kept in the store (R-API7: replica B
	// behind a Service shows what replica A did).
	w.fleetJournal, _ = sw.store.(breaker.FleetJournal)
	w.reporter.SetFleet(w.fleetJournal)
	w.mgr = &routes.Manager{Store: sw.overlays, Log: log, SharedStore: sw.shared}
	w.refresher.Manager = w.mgr
	if sw.shared {
		w.refresher.Every = 5 * time.Second // the periodic overlay check (R-ST9)
	}
	if w.rt, err = w.mgr.Open(ctx, w.file.data); err != nil {
		return err
	}
	in.holdConfig(w)
	return nil
}

// storeWorkers is the store's background work (the Redis replica view and
// record workers) as a component; the memory store has none.
func storeWorkers(sw *storeWiring) component {
	if sw.start == nil {
		return component{name: "store workers"}
	}
	bg, cancel := context.WithCancel(context.Background())
	var wait func()
	return component{
		name:  "store workers",
		start: func() { wait = sw.start(bg).Wait },
		stop:  func() { cancel(); wait() },
	}
}

// holdConfig publishes the effective config with the flags' listeners and
// store, and makes its reloader.
func (in *Instance) holdConfig(w *wiring) {
	rt, f := w.rt, w.f
	if f.GRPCAddr != "" {
		rt.Listen.GRPC = f.GRPCAddr
	}
	if f.AdminAddr != "" {
		rt.Listen.Admin = f.AdminAddr
	}
	rt.Store.Redis.URL, rt.Store.Backend = w.file.rt.Store.Redis.URL, w.file.rt.Store.Backend
	in.Config = routes.NewHolder(rt)
	in.Health.Set("config", admin.Component{Ready: true, Detail: nameOr(f.Config)})
	w.reloader = &routes.Reloader{
		Path: f.Config, Holder: in.Config, Log: in.Log, Started: &w.file.settings, Manager: w.mgr, MaxBytes: rt.Limits.MaxConfigBytes,
		OnResult:      func(r string) { in.Metrics.ConfigReloads.WithLabelValues(r).Inc() },
		OnFallback:    func(routes.Fallback) { in.Metrics.ConfigFallbacks.Inc() },
		OnRefusedRead: func() { in.Metrics.Refused.WithLabelValues(metrics.RefusedConfigFile).Inc() },
	}
	w.mgr.Holder, w.mgr.Report = in.Config, w.reloader.Report
	w.reloader.Report(rt)
	w.history = breaker.NewHistory()
	if rt.Store.Backend == routes.StoreMemory && rt.Store.Memory.PersistPath == "" {
		in.Log.Warn("store.memory.persist_path is empty: admin changes are not kept across restarts")
	}
}

// listen opens both listeners with their TLS (R-L5).
func (in *Instance) listen(w *wiring) error {
	rt := w.rt
	var err error
	if in.grpcLn, err = listenGRPC(rt.Listen.GRPC, rt.Listen.GRPCSocket); err != nil {
		return fmt.Errorf("listen.grpc: %w", err)
	}
	in.group.add(component{name: "grpc listener", stop: func() { in.grpcLn.Close() }})
	if in.adminLn, err = net.Listen("tcp", rt.Listen.Admin); err != nil {
		return fmt.Errorf("listen.admin: %w", err)
	}
	in.group.add(component{name: "admin listener", stop: func() { in.adminLn.Close() }})
	grpcTLS, adminTLS, err := listenerTLS(rt, in.Log)
	if err != nil {
		return err
	}
	if adminTLS != nil {
		in.adminLn = tls.NewListener(in.adminLn, adminTLS)
	}
	if grpcTLS == nil && !admin.IsLoopbackAddr(in.grpcLn.Addr()) {
		in.Log.Warn("listen.grpc is not loopback and listen.tls is not set: anyone who reaches it can report outcomes; bind it to loopback or set listen.tls with client_ca_file",
			"addr", in.GRPCAddr())
	}
	w.grpcTLS = grpcTLS
	return nil
}

// adminServer serves the admin listener; stopping it waits up to 5 s for
// the requests in flight.
func (in *Instance) adminServer() component {
	return component{
		name: "admin server",
		start: func() {
			go func() {
				if err := in.httpSrv.Serve(in.adminLn); !errors.Is(err, http.ErrServerClosed) {
					in.serveErr <- err
				}
			}()
		},
		stop: func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = in.httpSrv.Shutdown(sctx)
		},
	}
}

// grpcServerComponent serves the ext_proc listener; stopping it lets the
// streams finish for up to 5 s, then cuts them, and waits up to 5 s more
// for their handlers (both stops wait for them: what a handler records
// or traces last comes before the store's workers and the tracer stop).
func (in *Instance) grpcServerComponent() component {
	return component{
		name:  "ext_proc server",
		start: func() { go func() { in.serveErr <- in.grpcSrv.Serve(in.grpcLn) }() },
		stop: func() {
			stopped := make(chan struct{})
			go func() { in.grpcSrv.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				go in.grpcSrv.Stop()
				select {
				case <-stopped:
				case <-time.After(5 * time.Second):
					in.Log.Error("stopping: ext_proc handlers still running 5 s after their streams were cut; going on without them")
				}
			}
			// Nothing served now: the decisions' timers go with it, so
			// none keeps the stopped fusebox alive (timers.go).
			if in.proc != nil {
				in.proc.Stop()
			}
		},
	}
}

// reloaderLoop reloads the config file on SIGHUP and every
// -reload-interval; with no file, a SIGHUP is said and otherwise ignored.
func (in *Instance) reloaderLoop(w *wiring) component {
	guardSIGHUP()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if w.f.Config != "" {
		w.reloader.Prime()
	}
	return loop("reloader", func(ctx context.Context) {
		defer signal.Stop(hup)
		if w.f.Config != "" {
			w.reloader.Run(ctx, w.f.ReloadInterval, hup)
			return
		}
		// Nothing to reload: a SIGHUP (a config-reload sidecar, a
		// terminal that closed) is said and otherwise ignored.
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				in.Log.Info("[config] SIGHUP: there is no config file to reload (the embedded default config is in force)")
			}
		}
	})
}
