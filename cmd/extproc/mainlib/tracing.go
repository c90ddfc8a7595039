package mainlib

import (
	"context"
	"os"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/tracing"
)

// startTracing starts the OpenTelemetry exporter when the config's tracing
// section or OTEL_TRACES_EXPORTER=otlp asks for it (SPEC §17, R-TR1): a
// component, so that spans batched at shutdown are sent within the grace.
func (in *Instance) startTracing(ctx context.Context, w *wiring) error {
	t := w.rt.Tracing
	r, on, err := tracing.Resolve(tracing.Settings{Enabled: t.Enabled, Endpoint: t.Endpoint, Protocol: t.Protocol, ServiceName: t.ServiceName}, os.Getenv)
	if err != nil || !on {
		return err
	}
	tr, err := tracing.Start(ctx, r, w.journal.Replica())
	if err != nil {
		return err
	}
	in.tracer = tr
	in.group.add(component{name: "tracing", stop: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = tr.Shutdown(sctx)
	}})
	in.Log.Info("tracing on: OTLP spans of each sampled decision", "protocol", r.Protocol, "endpoint", r.Endpoint, "service", r.ServiceName)
	return nil
}
