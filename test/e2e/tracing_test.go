package e2e

import (
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/fusebox-llm/fusebox/pkg/tracing"
	"github.com/fusebox-llm/fusebox/pkg/tracing/otlptest"
	"github.com/fusebox-llm/fusebox/test/e2e/envoyconfig"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// uncommentTracing is envoy/envoy.yaml with its tracing blocks turned on,
// as docs/tracing.md tells a user to.
func uncommentTracing(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in := false
	lead := regexp.MustCompile(`^(\s*)# ?`)
	blocks := 0
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.Contains(l, "# --- tracing"):
			in, blocks = true, blocks+1
			continue
		case strings.Contains(l, "# --- end tracing ---"):
			in = false
			continue
		case in:
			l = lead.ReplaceAllString(l, "$1")
		}
		out = append(out, l)
	}
	if blocks != 2 {
		t.Fatalf("envoy.yaml has %d tracing blocks, want 2 (the tracer, its cluster)", blocks)
	}
	return []byte(strings.Join(out, "\n"))
}

// R-TR2, R-TR3 end to end (#55): Envoy's tracer on (envoy.yaml's block),
// fusebox's tracing on, both exporting to an OTLP receiver. The request's
// trace shows Envoy's request span, its ext_proc egress span, fusebox's
// decision as that span's child, and the outcome under the decision.
func TestARequestsTraceShowsTheDecision(t *testing.T) {
	boot, err := envoyconfig.Parse(uncommentTracing(t))
	if err != nil {
		t.Fatal(err)
	}
	traced, err := envoyconfig.Harness(boot)
	if err != nil {
		t.Fatal(err)
	}
	if traced.Tracing == nil || traced.Tracing.Cluster != "otel_collector" || traced.Tracing.RandomSampling != 100 {
		t.Fatalf("envoy.yaml's tracer, uncommented: %+v", traced.Tracing)
	}
	rcv := otlptest.Start(t)
	u, _ := url.Parse(rcv.GRPC)
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	w := newWorldConfig(t, "tracing: {enabled: true, protocol: grpc, endpoint: "+rcv.GRPC+"}\n"+fuseboxConfig)
	p := w.proxy("default", nil, func(c *envoysim.Config) {
		tr := *traced.Tracing
		tr.Addr = u.Host
		c.Tracing = &tr
	})
	if r := chat(t, p, "gpt-4o-mini", false); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	p.Close()
	w.stopFusebox() // sends what fusebox batched
	byName := map[string][]otlptest.Span{}
	for _, s := range rcv.Spans() {
		byName[s.Name] = append(byName[s.Name], s)
	}
	var ingress otlptest.Span
	for n, s := range byName {
		if strings.HasPrefix(n, "ingress ") {
			ingress = s[0]
		}
	}
	egress := map[string]bool{} // the ext_proc streams' client spans, under the request's
	for _, e := range byName["async envoy.service.ext_proc.v3.ExternalProcessor.Process egress"] {
		if e.ParentID == ingress.ID {
			egress[e.ID] = true
		}
	}
	if ingress.ID == "" || len(egress) == 0 || ingress.Service != "envoy" {
		t.Fatalf("Envoy's spans: %v", byName)
	}
	dec := byName[tracing.SpanDecide]
	if len(dec) != 1 || dec[0].TraceID != ingress.TraceID || dec[0].Service != "fusebox" || dec[0].Attrs[tracing.AttrRoute] != "openai:us-east:gpt-4o-mini" {
		t.Fatalf("fusebox's decision: %+v (Envoy's trace %s)", dec, ingress.TraceID)
	}
	if !egress[dec[0].ParentID] {
		t.Fatalf("the decision's parent %s is not an ext_proc egress span of the request (%v)", dec[0].ParentID, egress)
	}
	outs := byName[tracing.SpanOutcome]
	if len(outs) != 1 || outs[0].TraceID != ingress.TraceID || outs[0].Attrs[tracing.AttrOutcomeClass] != "success" {
		t.Fatalf("the outcome: %+v", outs)
	}
}
