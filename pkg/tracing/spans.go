package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Decision is what a decision's span says (R-TR2).
type Decision struct {
	Start time.Time
	// Gateway, Model (the client's), Provider and Route (the chosen
	// route's; "" when none was), ID (fusebox.decision; "" when the route
	// is not tracked), Action (routed, skipped, try_all, fail_fast, ...).
	Gateway, Model, Provider, Route, ID, Action string
	// DecidedBy: memory, redis or local; State and Generation: the
	// chosen route's breaker as the decision read it.
	DecidedBy, State string
	Generation       uint64
	PolicyVersion    string
	// Candidates: each candidate in order, "route:verdict".
	Candidates []string
}

// Span is a decision's span, open while its route role's stream is; its
// outcomes and attempts hang under it. A nil *Span makes nothing.
type Span struct {
	t      *Tracer
	span   trace.Span
	parent trace.SpanContext
}

// Decide starts the decision's span as a child of Envoy's context. It
// makes nothing (nil) when tracing is off, or when Envoy sent no context
// or one it does not sample: the parent decides.
func (t *Tracer) Decide(parent trace.SpanContext, d Decision) *Span {
	if t == nil || !parent.IsSampled() {
		return nil
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		attribute.String(AttrGateway, d.Gateway),
		attribute.String(AttrModel, d.Model),
		attribute.String(AttrAction, d.Action),
		attribute.String(AttrReplica, t.replica),
		attribute.StringSlice(AttrCandidates, d.Candidates))
	if d.Route != "" {
		attrs = append(attrs,
			attribute.String(AttrRoute, d.Route),
			attribute.String(AttrProvider, d.Provider),
			attribute.String(AttrDecidedBy, d.DecidedBy),
			attribute.String(AttrState, d.State),
			attribute.Int64(AttrGeneration, int64(d.Generation)),
			attribute.String(AttrPolicyVersion, d.PolicyVersion))
	}
	if d.ID != "" {
		attrs = append(attrs, attribute.String(AttrDecision, d.ID))
	}
	_, sp := t.tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), SpanDecide,
		trace.WithTimestamp(d.Start), trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return &Span{t: t, span: sp, parent: parent}
}

// End closes the decision's span at at (the route role's stream ended).
func (s *Span) End(at time.Time) {
	if s != nil {
		s.span.End(trace.WithTimestamp(at))
	}
}

// Context is the decision span's own context.
func (s *Span) Context() trace.SpanContext {
	if s == nil {
		return trace.SpanContext{}
	}
	return s.span.SpanContext()
}

// Outcome is what an outcome's span says (R-TR3).
type Outcome struct {
	Start, End time.Time
	// Route is the route the outcome was recorded against.
	Route                          string
	Class, Reason, Origin, Channel string
	// Transitions: the breaker changes this outcome made, each a
	// fusebox.transition event.
	Transitions []Transition
}

// Transition is one breaker change an outcome made, with its evidence.
type Transition struct {
	At         time.Time
	Route      string
	Transition string // closed->open, ...
	Reason     string
	Failures   int
	Threshold  int
	OpenUntil  time.Time // zero: none
}

// Outcome records o as a fusebox.outcome span: a child of the decision's
// span while it is open, and after it (an entry or an observer that came
// late, an expiry) a span under Envoy's context, in the same trace,
// linked to the decision's.
func (s *Span) Outcome(o Outcome) {
	if s == nil {
		return
	}
	s.t.outcome(s.span, s.parent, o)
}

// spanRef is what outcome needs of the span it hangs under.
type spanRef interface {
	SpanContext() trace.SpanContext
	IsRecording() bool
}

func (t *Tracer) outcome(dec spanRef, envoy trace.SpanContext, o Outcome) {
	parent := dec.SpanContext()
	var opts []trace.SpanStartOption
	if !dec.IsRecording() {
		parent = envoy
		if dec.SpanContext().IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: dec.SpanContext()}))
		}
	}
	start := o.Start
	if start.IsZero() {
		start = o.End
	}
	opts = append(opts, trace.WithTimestamp(start), trace.WithAttributes(
		attribute.String(AttrRoute, o.Route),
		attribute.String(AttrOutcomeClass, o.Class),
		attribute.String(AttrOutcomeReason, o.Reason),
		attribute.String(AttrOutcomeOrigin, o.Origin),
		attribute.String(AttrOutcomeChannel, o.Channel)))
	_, sp := t.tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), SpanOutcome, opts...)
	if o.Class == "failure" {
		sp.SetStatus(codes.Error, o.Reason)
	}
	for _, tr := range o.Transitions {
		attrs := []attribute.KeyValue{
			attribute.String(AttrRoute, tr.Route),
			attribute.String(AttrTransition, tr.Transition),
			attribute.String(AttrTransitionReason, tr.Reason),
			attribute.Int(AttrTransitionFailures, tr.Failures),
			attribute.Int(AttrTransitionThreshold, tr.Threshold),
		}
		if !tr.OpenUntil.IsZero() {
			attrs = append(attrs, attribute.String(AttrTransitionOpenUntil, tr.OpenUntil.UTC().Format(time.RFC3339Nano)))
		}
		sp.AddEvent(EventTransition, trace.WithTimestamp(tr.At), trace.WithAttributes(attrs...))
	}
	sp.End(trace.WithTimestamp(o.End))
}

// Attempt is a failover attempt's span, a child of its decision's.
type Attempt struct {
	t    *Tracer
	span trace.Span
}

// Attempt starts attempt n's span (on route, of provider) under the
// decision; nil when the decision has no span.
func (s *Span) Attempt(n int, route, provider string, start time.Time) *Attempt {
	if s == nil {
		return nil
	}
	_, sp := s.t.tr.Start(trace.ContextWithSpanContext(context.Background(), s.span.SpanContext()), SpanAttempt,
		trace.WithTimestamp(start), trace.WithAttributes(
			attribute.Int(AttrAttempt, n),
			attribute.String(AttrRoute, route),
			attribute.String(AttrProvider, provider)))
	return &Attempt{t: s.t, span: sp}
}

// AttemptIn starts attempt n's span under parent, the context Envoy sent
// on the attempt's own stream (the request's trace), when the decision's
// span is another replica's: nil when parent is not sampled.
func (t *Tracer) AttemptIn(parent trace.SpanContext, n int, route, provider string, start time.Time) *Attempt {
	if t == nil || !parent.IsSampled() {
		return nil
	}
	_, sp := t.tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), SpanAttempt,
		trace.WithTimestamp(start), trace.WithAttributes(
			attribute.Int(AttrAttempt, n),
			attribute.String(AttrRoute, route),
			attribute.String(AttrProvider, provider)))
	return &Attempt{t: t, span: sp}
}

// Outcome records the attempt's outcome under it.
func (a *Attempt) Outcome(o Outcome) {
	if a == nil {
		return
	}
	a.t.outcome(a.span, a.span.SpanContext(), o)
}

// End closes the attempt's span.
func (a *Attempt) End(at time.Time) {
	if a != nil {
		a.span.End(trace.WithTimestamp(at))
	}
}

// Traceparent is sc as a W3C traceparent header value.
func Traceparent(sc trace.SpanContext) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"]
}

// OutcomeUnder records o under the decision span traceparent names (the
// decision's metadata, read on a replica that does not hold the span):
// a child of it, linked to it, in its trace; nothing when it is not a
// sampled context.
func (t *Tracer) OutcomeUnder(traceparent string, o Outcome) {
	if t == nil {
		return
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsSampled() {
		return
	}
	t.outcome(nonRecording{sc}, sc, o)
}

// OutcomeIn records o under parent (the observer's own Envoy context, when
// the decision's span is another replica's and unnamed).
func (t *Tracer) OutcomeIn(parent trace.SpanContext, o Outcome) {
	if t == nil || !parent.IsSampled() {
		return
	}
	t.outcome(nonRecording{trace.SpanContext{}}, parent, o)
}

// nonRecording is a span known only by its context: an outcome under it
// is linked to it too.
type nonRecording struct{ sc trace.SpanContext }

func (n nonRecording) SpanContext() trace.SpanContext { return n.sc }
func (nonRecording) IsRecording() bool                { return false }
