package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"credbroker/vault"
)

// StoreObserver returns the vault.Observer that puts every store
// operation, of every feature, in a span named "vault.<operation>"
// (attribute vault.operation; never an id, a principal or a token): give
// it to vault.Observe. A nil provider returns nil (nothing is observed).
func StoreObserver(tp trace.TracerProvider) vault.Observer {
	if tp == nil {
		return nil
	}
	return storeObserver{Tracer(tp)}
}

type storeObserver struct{ tr trace.Tracer }

// storeSpan is where Begin keeps its span for End: the context may carry
// later spans of other observers.
type storeSpan struct{}

func (o storeObserver) Begin(ctx context.Context, op string) context.Context {
	ctx, span := o.tr.Start(ctx, "vault."+op, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("vault.operation", op)))
	return context.WithValue(ctx, storeSpan{}, span)
}

// End records a failure's kind, never its text (which may name an id).
func (storeObserver) End(ctx context.Context, _ string, _ time.Duration, err error) {
	span, ok := ctx.Value(storeSpan{}).(trace.Span)
	if !ok {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, "vault operation failed")
	}
	span.End()
}
