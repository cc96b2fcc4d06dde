// Package tracing is the broker's OpenTelemetry tracing: the tracer
// provider built from the standard OTEL_* environment variables, the
// redacting span exporter in front of every exporter, the store observer
// (a vault.Observer: a span per store operation), the IdP client wrapper,
// and the W3C trace context propagator the broker uses.
//
// Tracing is off unless OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or OTEL_TRACES_EXPORTER is
// "otlp". Off means a nil trace.TracerProvider: the packages that trace
// check for nil and do nothing, and no exporter goroutine runs.
//
// Spans never carry a principal (iss, sub), a token, a code, a grant id, a
// cookie or a URL query: the callers never set them, and the redacting
// exporter masks what still looks like one (the rules of logredact, plus
// URLs cut to scheme, host and path).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/telemetry"
)

// TracerName names the broker's instrumentation scope.
const TracerName = "credbroker"

// Propagator is the only propagation format the broker reads and writes:
// W3C trace context (traceparent, tracestate). Baggage is never read or
// sent.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Tracer returns the broker's tracer from tp, or nil when tp is nil
// (tracing off).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// Config is what the OTEL_* environment asks for.
type Config struct {
	Enabled bool
	// Endpoint is the OTLP/HTTP traces URL ("" leaves the SDK's default,
	// http://localhost:4318/v1/traces).
	Endpoint string
}

// ConfigFromEnv reads the standard variables. An exporter or protocol the
// broker does not support is an error, never a silent fallback.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return c, nil
	}
	exporter := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	switch strings.ToLower(exporter) {
	case "none":
		return c, nil
	case "otlp":
		c.Enabled = true
	case "":
	default:
		return c, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported (use otlp or none)", exporter)
	}
	if ep := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")); ep != "" {
		c.Enabled, c.Endpoint = true, ep
	} else if ep := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")); ep != "" {
		c.Enabled, c.Endpoint = true, strings.TrimSuffix(ep, "/")+"/v1/traces"
	}
	if !c.Enabled {
		return c, nil
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, errors.New("the OTLP traces endpoint must be an http(s) URL")
		}
	}
	proto := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if proto == "" {
		proto = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	if proto != "" && proto != "http/protobuf" {
		return c, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q is not supported (use http/protobuf)", proto)
	}
	return c, nil
}

// Setup builds the tracer provider the environment asks for. Off, it
// returns a nil provider and a shutdown that does nothing. On, spans go
// through the redacting exporter to OTLP/HTTP in batches; shutdown flushes
// them and stops the exporter. The other OTEL_* variables (headers,
// timeout, sampler, batch sizes, service name and resource attributes) are
// read by the SDK itself.
func Setup(ctx context.Context, getenv func(string) string, version string) (trace.TracerProvider, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	cfg, err := ConfigFromEnv(getenv)
	if err != nil || !cfg.Enabled {
		return nil, none, err
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(cfg.Endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, none, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := Resource(ctx, version)
	if err != nil {
		return nil, none, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(Redacting(exp)), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// Resource names the service: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES win over the defaults (credbroker, version).
func Resource(ctx context.Context, version string) (*resource.Resource, error) {
	def := resource.NewSchemaless(attribute.String("service.name", "credbroker"), attribute.String("service.version", version))
	env, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("OTEL resource: %w", err)
	}
	return resource.Merge(def, env)
}

// NewSyncProvider is a tracer provider that hands each span to exp (behind
// the redacting exporter) as it ends: tests use it with tracetest's
// in-memory exporter.
func NewSyncProvider(exp sdktrace.SpanExporter) *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(Redacting(exp)))
}

// WrapIdPClient returns a copy of c whose transport makes an
// "idp.http <METHOD>" client span of every request to the identity
// provider, as a child of the request's context: method, the IdP's host
// (server.address) and the status. Unlike WrapClient it records no URL,
// since the IdP's URLs spell out the issuer, which is half of every
// principal (provider calls use otelhttp, see provider.withTracing).
// Nothing is propagated to the IdP. With tp nil (tracing off) it returns c
// itself.
func WrapIdPClient(c *http.Client, tp trace.TracerProvider) *http.Client {
	if tp == nil {
		return c
	}
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	cc := *c
	cc.Transport = idpTransport{next: next, tracer: Tracer(tp)}
	return &cc
}

type idpTransport struct {
	next   http.RoundTripper
	tracer trace.Tracer
}

func (t idpTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := t.tracer.Start(r.Context(), "idp.http "+r.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("server.address", r.URL.Hostname())))
	resp, err := t.next.RoundTrip(r.WithContext(ctx))
	if err != nil {
		span.SetStatus(codes.Error, "request failed")
		span.End()
		return nil, err
	}
	EndServer(span, resp.StatusCode) // the status attribute; 5xx is an error
	return resp, nil
}

// Handler wraps h in a server span named name when tracer is set (nil:
// h as it is). The span carries the method, the matched route pattern
// (read when h returns, so a mux inside h counts; never the path, which is
// the caller's text), whatever attrs gives for the request (nil: nothing
// more), and the status answered.
func Handler(tracer trace.Tracer, name string, h http.Handler, attrs func(*http.Request) []attribute.KeyValue) http.Handler {
	if tracer == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method))}
		if attrs != nil {
			opts = append(opts, trace.WithAttributes(attrs(r)...))
		}
		ctx, span := tracer.Start(r.Context(), name, opts...)
		sw := &telemetry.StatusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		defer func() {
			span.SetAttributes(attribute.String("http.route", r.Pattern))
			EndServer(span, sw.Status)
		}()
		h.ServeHTTP(sw, r)
	})
}

// EndServer ends a server span with the HTTP status answered, marking a
// 5xx as an error (its status text only). IdP client spans end the same
// way with the status they received.
func EndServer(span trace.Span, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}
