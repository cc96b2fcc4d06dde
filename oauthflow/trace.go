package oauthflow

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"

	"credbroker/connections"
	"credbroker/internal/tracing"
)

// traced wraps a browser step's handler in a span named step, with the
// route's pattern (never the grant id itself: its connections.Ref, which logs
// carry too), the provider's name on a callback, and the status answered.
// Without tracing h is returned as it is.
func (f *Flow) traced(step string, h http.Handler) http.Handler {
	return tracing.Handler(f.tracer, step, h, func(r *http.Request) []attribute.KeyValue {
		var attrs []attribute.KeyValue
		if g := r.PathValue("grant"); g != "" {
			attrs = append(attrs, attribute.String("credbroker.grant_ref", connections.Ref(g)))
		}
		if p := r.PathValue("provider"); p != "" {
			if _, ok := f.providers.Lookup(p); ok {
				attrs = append(attrs, attribute.String("provider", p))
			}
		}
		return attrs
	})
}
