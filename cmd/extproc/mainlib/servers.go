package mainlib

import (
	"fmt"
	"os"
	"strings"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fusebox-llm/fusebox/pkg/admin"
	"github.com/fusebox-llm/fusebox/pkg/processor"
)

// buildServers builds what the two listeners serve: on the ext_proc one
// the processor, the access log service and grpc.health.v1 (which follows
// the readiness); on the admin one the admin API and the dashboard.
func (in *Instance) buildServers(w *wiring) {
	rt := w.rt
	in.grpcSrv = newGRPCServer(w.f.GRPCServer, rt.Limits, w.grpcTLS)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(in.grpcSrv, hs)
	w.proc = in.newProcessor(w)
	in.proc = w.proc
	extprocv3.RegisterExternalProcessorServer(in.grpcSrv, w.proc)
	// The access log channel (SPEC §4a) on the same listener, TLS and limits.
	accesslogv3.RegisterAccessLogServiceServer(in.grpcSrv, w.proc.AccessLogService())
	in.Health.Set("access_log", admin.Component{Ready: true, Detail: "not connected"})
	in.Health.OnChange(func(serving bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if serving {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus("", st)
		hs.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, st)
	})
	in.httpSrv = adminHTTPServer(in.newAdmin(w))
}

// newProcessor is the ext_proc service, reporting the access log channel
// and a deployment that does not match the config to the health page.
func (in *Instance) newProcessor(w *wiring) *processor.Server {
	rt := w.rt
	return processor.NewServer(processor.Options{
		Config: in.Config, Store: in.Store, Clock: in.Clock, Metrics: in.Metrics, Log: in.Log,
		MaxStreams: rt.Limits.MaxConcurrentStreams, History: w.history, TokenKey: w.sw.fleetKey, Journal: w.journal, Tracer: in.tracer,
		Replica:    w.journal.Replica(),
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
}

// newAdmin is the admin listener's handler: health, metrics, the admin
// API with its guards, the gateways' admin changes and the dashboard.
func (in *Instance) newAdmin(w *wiring) *admin.Server {
	rt := w.rt
	// A token read from a secret file often ends with a newline; it could
	// never match (R-L4).
	token := strings.TrimSpace(os.Getenv(rt.Admin.TokenEnv))
	refused := func(what string) { in.Metrics.Refused.WithLabelValues(what).Inc() }
	auth := admin.Auth{Token: token, Loopback: admin.IsLoopbackAddr(in.adminLn.Addr()), Log: in.Log, Refused: refused}
	switch {
	case token == "" && !auth.Loopback:
		in.Log.Warn("[admin] no token is set ("+rt.Admin.TokenEnv+") and the admin listener is not loopback: /admin/v1 answers 403",
			"addr", in.AdminAddr())
	case token != "" && len(token) < 16:
		in.Log.Warn("[admin] the admin token is shorter than 16 bytes: use a long random one", "token_env", rt.Admin.TokenEnv)
	}
	adm := admin.NewServer(in.Health, in.Metrics.Registry, auth)
	api := &admin.API{Config: in.Config, Store: in.Store, Clock: in.Clock, Log: in.Log, History: w.history,
		Baseline: w.proc.LatencyBaselineMs, Journal: w.journal, FleetJournal: w.fleetJournal}
	api.Register(adm)
	(&admin.Gateways{Manager: w.mgr, API: api, Refused: refused}).Register(adm)
	adm.RegisterDashboard()
	return adm
}
