package oauthflow

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"

	"credbroker/connections"
)

// spanAttrs are what a browser step's span carries besides the route and
// the status (web.Kit.Route): never the grant id itself, its
// connections.Ref, which logs carry too; the provider's name on a
// callback when it is a configured one.
func (f *Flow) spanAttrs(r *http.Request) []attribute.KeyValue {
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
}
