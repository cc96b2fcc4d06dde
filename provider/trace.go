package provider

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/tracing"
)

// noSpan is what startSpan hands out with tracing off: it records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// startSpan starts a span when tracing is on; off, ctx and noSpan.
func (k *Client) startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if k.tracer == nil {
		return ctx, noSpan
	}
	return k.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// endSpan ends span, marking it failed with a fixed description (an
// error's text may name an id or echo the provider).
func endSpan(span trace.Span, err error, what string) {
	if err != nil {
		span.SetStatus(codes.Error, what)
	}
	span.End()
}

// withTracing returns a copy of c whose transport makes a client span of
// every request (otelhttp): URL without its query (the redacting exporter
// cuts it), method, status. The trace context goes out only on requests
// whose context tracing.WithPropagation marked (propagate_trace: true);
// baggage never does.
func withTracing(c *http.Client, tp trace.TracerProvider) *http.Client {
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	cc := *c
	cc.Transport = otelhttp.NewTransport(next,
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(tracing.OptIn{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "provider.http " + r.Method }),
	)
	return &cc
}
