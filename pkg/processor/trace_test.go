package processor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/tracing"
	"github.com/fusebox-llm/fusebox/pkg/tracing/otlptest"
)

const (
	envoyTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	envoySpan  = "00f067aa0ba902b7"
)

// tracedEnv is env with tracing on, exporting to an in-process OTLP
// receiver, and Envoy's traceparent (sampled) on every stream; flush
// sends what is batched and returns the receiver.
func tracedEnv(t *testing.T, mk func(*testing.T, ...func(*Options)) *env) (*env, func() *otlptest.Receiver) {
	t.Helper()
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	r, _, err := tracing.Resolve(tracing.Settings{Enabled: new(true), Protocol: "grpc", Endpoint: rcv.GRPC}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracing.Start(context.Background(), r, "replica-t")
	if err != nil {
		t.Fatal(err)
	}
	e := mk(t, func(o *Options) { o.Tracer = tr })
	e.traceparent = "00-" + envoyTrace + "-" + envoySpan + "-01"
	return e, func() *otlptest.Receiver {
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		return rcv
	}
}

func oneSpan(t *testing.T, s []otlptest.Span, what string) otlptest.Span {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("%s: %d spans, want 1: %+v", what, len(s), s)
	}
	return s[0]
}

// R-TR2, R-TR3 through the processor, on the wire: each request's
// decision is a child of Envoy's span with its candidates, its outcome
// hangs under it (a child while the stream is open, linked after), a
// failover attempt is a child of the decision, a transition is an event.
func TestTraces(t *testing.T) {
	t.Run("a route decision past an open route, its 503 opening the next", func(t *testing.T) {
		e, flush := tracedEnv(t, newEnv)
		e.openRoute("default", "openai:us:gpt")
		e.record503("azure:eu:gpt") // one of the threshold's two
		c := e.open("")
		c.chat("gpt")
		c.respHeaders("503", true, attrs(0, "via_upstream"))
		c.end()
		rcv := flush()
		dec := oneSpan(t, rcv.Named(tracing.SpanDecide), "decisions")
		if dec.TraceID != envoyTrace || dec.ParentID != envoySpan {
			t.Fatalf("the decision's span is not a child of Envoy's: %+v", dec)
		}
		for k, v := range map[string]any{tracing.AttrGateway: "default", tracing.AttrModel: "gpt", tracing.AttrRoute: "azure:eu:gpt",
			tracing.AttrProvider: "azure", tracing.AttrState: "closed", tracing.AttrDecidedBy: "memory", tracing.AttrReplica: "replica-t",
			tracing.AttrAction: "skipped"} {
			if dec.Attrs[k] != v {
				t.Errorf("%s = %v, want %v", k, dec.Attrs[k], v)
			}
		}
		if c, _ := dec.Attrs[tracing.AttrCandidates].([]any); !slices.Equal(c, []any{"openai:us:gpt:open", "azure:eu:gpt:chosen"}) {
			t.Errorf("candidates %v", dec.Attrs[tracing.AttrCandidates])
		}
		if id, _ := dec.Attrs[tracing.AttrDecision].(string); id == "" {
			t.Error("no decision id")
		}
		out := oneSpan(t, rcv.Named(tracing.SpanOutcome), "outcomes")
		if out.ParentID != dec.ID || out.Attrs[tracing.AttrOutcomeClass] != "failure" || out.Attrs[tracing.AttrOutcomeReason] != "provider_5xx" ||
			out.Attrs[tracing.AttrOutcomeOrigin] != "upstream" || out.Attrs[tracing.AttrOutcomeChannel] != "stream" || !out.Error {
			t.Fatalf("outcome %+v", out)
		}
		if len(out.Events) != 1 || out.Events[0].Name != tracing.EventTransition || out.Events[0].Attrs[tracing.AttrTransition] != "closed->open" ||
			out.Events[0].Attrs[tracing.AttrTransitionThreshold] != int64(2) {
			t.Fatalf("the transition the 503 made: %+v", out.Events)
		}
		for _, s := range rcv.Spans() {
			for k, v := range s.Attrs {
				if sv, ok := v.(string); ok && (sv == "hi" || k == "content-type") {
					t.Errorf("span %s carries request content (%s=%q)", s.Name, k, sv)
				}
			}
		}
	})
	t.Run("observer: the outcome after the stream ended is linked", func(t *testing.T) {
		e, flush := tracedEnv(t, newObserverEnv)
		md := e.observedDecision("gpt")
		e.observe(md, "200", `{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`)
		eventually(t, "the observer records", func() bool { return e.outcomes("openai:us:gpt", "success", "success") == 1 })
		rcv := flush()
		dec := oneSpan(t, rcv.Named(tracing.SpanDecide), "decisions")
		out := oneSpan(t, rcv.Named(tracing.SpanOutcome), "outcomes")
		if out.TraceID != envoyTrace || out.ParentID != envoySpan || !slices.Contains(out.Links, dec.ID) ||
			out.Attrs[tracing.AttrOutcomeChannel] != "observer" || out.Attrs[tracing.AttrOutcomeClass] != "success" {
			t.Fatalf("late outcome %+v, want under Envoy's span linked to %s", out, dec.ID)
		}
	})
	t.Run("expiry: nothing came within decision_wait_sec", func(t *testing.T) {
		e, flush := tracedEnv(t, newObserverEnv)
		e.observedDecision("gpt")
		e.clk.Advance(301 * time.Second)
		eventually(t, "the neither", func() bool { return e.outcomes("openai:us:gpt", "neither", "no_outcome") == 1 })
		out := oneSpan(t, flush().Named(tracing.SpanOutcome), "outcomes")
		if out.Attrs[tracing.AttrOutcomeChannel] != "expiry" || out.Attrs[tracing.AttrOutcomeReason] != "no_outcome" || len(out.Links) != 1 {
			t.Fatalf("expiry outcome %+v", out)
		}
	})
	t.Run("failover: each attempt under the decision", func(t *testing.T) {
		e, flush := tracedEnv(t, newFailoverEnv)
		tok := e.routeRole()
		c, _, _ := e.attempt(tok, "r-1", 1, "/v1/chat/completions")
		c.respHeaders("503", true, attrs(0, "via_upstream"))
		c.end()
		c, _, _ = e.attempt(tok, "r-1", 2, "/v1/chat/completions")
		c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
		c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
		c.end()
		// An attempt's record may wait for its arrival's note (off the
		// reply path).
		eventually(t, "both attempts recorded", func() bool {
			return e.outcomes("openai:us:gpt", "failure", "provider_5xx")+e.outcomes("azure:eu:gpt", "success", "success") == 2
		})
		rcv := flush()
		dec := oneSpan(t, rcv.Named(tracing.SpanDecide), "decisions")
		atts := rcv.Named(tracing.SpanAttempt)
		if len(atts) != 2 {
			t.Fatalf("%d attempt spans: %+v", len(atts), atts)
		}
		byN := map[int64]otlptest.Span{}
		for _, a := range atts {
			if a.ParentID != dec.ID {
				t.Errorf("attempt %+v not under the decision %s", a, dec.ID)
			}
			byN[a.Attrs[tracing.AttrAttempt].(int64)] = a
		}
		if byN[1].Attrs[tracing.AttrRoute] != "openai:us:fo" && byN[1].Attrs[tracing.AttrRoute] == byN[2].Attrs[tracing.AttrRoute] {
			t.Errorf("attempts on %v and %v", byN[1].Attrs[tracing.AttrRoute], byN[2].Attrs[tracing.AttrRoute])
		}
		outs := rcv.Named(tracing.SpanOutcome)
		if len(outs) != 2 {
			t.Fatalf("%d outcome spans", len(outs))
		}
		for _, o := range outs {
			switch o.ParentID {
			case byN[1].ID:
				if o.Attrs[tracing.AttrOutcomeClass] != "failure" {
					t.Errorf("attempt 1's outcome %+v", o)
				}
			case byN[2].ID:
				if o.Attrs[tracing.AttrOutcomeClass] != "success" {
					t.Errorf("attempt 2's outcome %+v", o)
				}
			default:
				t.Errorf("outcome %+v under neither attempt", o)
			}
		}
	})
	t.Run("observer on another replica: the outcome in the request's trace", func(t *testing.T) {
		a, flushA := tracedEnv(t, newObserverEnv)
		b, flushB := tracedEnv(t, replicaOf(a, newObserverEnv))
		md := a.observedDecision("gpt")
		b.observe(md, "200", `{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`)
		b.waitOutcomes("openai:us:gpt", "success", "success", 1)
		dec := oneSpan(t, flushA().Named(tracing.SpanDecide), "A's decisions")
		out := oneSpan(t, flushB().Named(tracing.SpanOutcome), "B's outcomes")
		if out.TraceID != dec.TraceID || out.Attrs[tracing.AttrOutcomeChannel] != "observer" || out.Attrs[tracing.AttrReplica] != nil {
			t.Fatalf("B's outcome %+v is not in the decision's trace %s", out, dec.TraceID)
		}
	})
	t.Run("the decision's metadata names its span, for an entry another replica reads", func(t *testing.T) {
		e, flush := tracedEnv(t, newEnv)
		c := e.open("")
		r := c.chat("gpt")
		c.end()
		tp := r.GetDynamicMetadata().GetFields()["fusebox"].GetStructValue().GetFields()[traceKey].GetStringValue()
		dec := oneSpan(t, flush().Named(tracing.SpanDecide), "decisions")
		if tp != "00-"+dec.TraceID+"-"+dec.ID+"-01" {
			t.Fatalf("fusebox.trace %q, the decision's span is %s/%s", tp, dec.TraceID, dec.ID)
		}
	})
	t.Run("failover: an attempt on another replica is in the request's trace", func(t *testing.T) {
		a, flushA := tracedEnv(t, newFailoverEnv)
		b, flushB := tracedEnv(t, replicaOf(a, newFailoverEnv))
		tok := a.routeRole()
		c, _, _ := b.attempt(tok, "r-1", 1, "/v1/chat/completions")
		c.respHeaders("200", false, attrs(0, "via_upstream"), "content-type", "application/json")
		c.respBody(`{"choices":[{"message":{"content":"ok"},"finish_reason":"stop"}]}`, true)
		c.end()
		b.waitOutcomes("openai:us:gpt", "success", "success", 1)
		dec := oneSpan(t, flushA().Named(tracing.SpanDecide), "A's decisions")
		rcv := flushB()
		att := oneSpan(t, rcv.Named(tracing.SpanAttempt), "B's attempts")
		out := oneSpan(t, rcv.Named(tracing.SpanOutcome), "B's outcomes")
		if att.TraceID != dec.TraceID || att.ParentID != envoySpan || out.ParentID != att.ID {
			t.Fatalf("attempt %+v, outcome %+v: not in the decision's trace %s", att, out, dec.TraceID)
		}
	})
	t.Run("a request Envoy did not sample makes no span", func(t *testing.T) {
		e, flush := tracedEnv(t, newEnv)
		e.traceparent = "00-" + envoyTrace + "-" + envoySpan + "-00"
		c := e.open("")
		c.chat("gpt")
		c.respHeaders("200", true, attrs(0, "via_upstream"))
		c.end()
		if s := flush().Spans(); len(s) != 0 {
			t.Fatalf("%d spans for an unsampled request", len(s))
		}
	})
}

// record503 records one 503 on route through the store, as another
// request would have.
func (e *env) record503(route string) {
	e.t.Helper()
	k := breaker.KeyOf(breaker.RouteID("default", route))
	now := e.clk.Now().UnixNano()
	adm, _, _ := e.store.Acquire(context.Background(), k, now, true)
	if _, err := e.store.Record(context.Background(), k, now, adm, breaker.Result{Kind: breaker.KindStatus, Status: 503}); err != nil {
		e.t.Fatal(err)
	}
}

type degradedStore struct {
	*breaker.Memory
	down bool
}

func (d degradedStore) Degraded() bool { return d.down }

// fusebox.decided_by names the store as the transition line does: memory;
// redis, or local while this replica's view is the store.
func TestDecidedBy(t *testing.T) {
	for _, c := range []struct {
		st   breaker.Store
		want string
	}{
		{breaker.NewMemory(nil), "memory"},
		{degradedStore{breaker.NewMemory(nil), false}, "redis"},
		{degradedStore{breaker.NewMemory(nil), true}, "local"},
	} {
		if got := decidedBy(c.st, "memory"); got != c.want {
			t.Errorf("%T: %q, want %q", c.st, got, c.want)
		}
	}
}

// replicaOf makes mk's env a second replica of a: its store, config and
// clock (meet_test.go's replica, with the options tracedEnv passes).
func replicaOf(a *env, mk func(*testing.T, ...func(*Options)) *env) func(*testing.T, ...func(*Options)) *env {
	return func(t *testing.T, opts ...func(*Options)) *env {
		r := mk(t, append(opts, func(o *Options) { o.Store, o.Config, o.Clock = a.store, a.holder, a.clk })...)
		r.store, r.holder, r.clk = a.store, a.holder, a.clk
		return r
	}
}
