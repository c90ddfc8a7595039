package mainlib

import (
	"context"
	"crypto/tls"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/fusebox-llm/fusebox/pkg/admin"
	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/extproc"
	"github.com/fusebox-llm/fusebox/pkg/grpcwire"
	"github.com/fusebox-llm/fusebox/pkg/metrics"
	"github.com/fusebox-llm/fusebox/pkg/processor"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"github.com/fusebox-llm/fusebox/pkg/tlsfiles"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
)

// Instance is a running fusebox.
type Instance struct {
	Log     *slog.Logger
	Metrics *metrics.Metrics
	Config  *routes.Holder
	Health  *admin.Health
	Store   breaker.Store
	Clock   breaker.Clock

	grpcLn, adminLn net.Listener
	grpcSrv         grpcServer
	httpSrv         *http.Server
	grace           time.Duration
	ctx             context.Context
	serveErr        chan error
	proc            *processor.Server
	tracer          *tracing.Tracer
	// group is what Start started, stopped by Wait in reverse order.
	group components
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
	// overlayCache gives store.redis.overlay_cache's default path.
	overlayCache func() string
}

// WithOverlayCache makes path the default of store.redis.overlay_cache
// ("" = off) in place of the user's cache directory: a test's fresh Redis
// must not be given another test's admin changes from the shared file.
func WithOverlayCache(path string) Option {
	return func(o *options) { o.overlayCache = func() string { return path } }
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
// *grpc.Server or pkg/grpcwire's *Server.
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
		Codec:                extproc.Codec{},
		MaxRecvMsgSize:       l.MaxMessageBytes,
		MaxRecvMsgSizeFor:    extproc.RecvBounds(),
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
		// (extproc/codec.go).
		grpc.ForceServerCodecV2(extproc.Codec{}),
		// An ext_proc stream's request headers are a few short fields (the
		// HTTP request travels in its messages); grpc-go decodes and keeps
		// every header of a stream, -bin ones included, so a 16 MiB list
		// let an HPACK bomb of 200 streams hold 258 MiB (the attack kit).
		grpc.MaxHeaderListSize(maxHeaderListSize),
		// Stop and GracefulStop return after the handlers have, as
		// grpcwire's do: a handler's last record or span comes before the
		// store's workers and the tracer stop.
		grpc.WaitForHandlers(true),
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
	// The ext_proc server first: once its streams are done nothing
	// records any more; then the loops and the store's record workers,
	// which write what is still queued (R-ST8), before the process ends.
	in.group.stop()
	in.Log.Info("fusebox stopped")
	return err
}
