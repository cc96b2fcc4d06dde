package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

type propagateKey struct{}

// WithPropagation marks ctx so that an outbound request made with it
// carries the trace context (a provider entry's propagate_trace: true).
func WithPropagation(ctx context.Context) context.Context {
	return context.WithValue(ctx, propagateKey{}, true)
}

// OptIn is the outbound propagator: W3C trace context, injected only into
// requests whose context WithPropagation marked. It never extracts and
// never sends baggage.
type OptIn struct{}

var _ propagation.TextMapPropagator = OptIn{}

// Inject implements propagation.TextMapPropagator.
func (OptIn) Inject(ctx context.Context, carrier propagation.TextMapCarrier) {
	if on, _ := ctx.Value(propagateKey{}).(bool); on {
		Propagator.Inject(ctx, carrier)
	}
}

// Extract implements propagation.TextMapPropagator: outbound answers carry
// no context the broker takes.
func (OptIn) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context { return ctx }

// Fields implements propagation.TextMapPropagator.
func (OptIn) Fields() []string { return Propagator.Fields() }

// FromMeta returns the remote span context carried in an MCP request's
// _meta (the unprefixed traceparent and tracestate keys of SEP-414); it is
// invalid when they are absent or malformed.
func FromMeta(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return trace.SpanContextFromContext(Propagator.Extract(context.Background(), c))
}

// FromHeader returns the remote span context of an incoming request's
// traceparent and tracestate headers (invalid when absent or malformed).
func FromHeader(h http.Header) trace.SpanContext {
	if h.Get("Traceparent") == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Propagator.Extract(context.Background(), propagation.HeaderCarrier(h)))
}
