package mcpapi

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
)

// observedWriter notes what serveMCP learned about a request so that one
// MCPRequest call can describe it when the handler returns.
type observedWriter struct {
	telemetry.StatusWriter
	start   time.Time
	method  string
	tool    string
	era     string
	outcome string // set by writeOutcome and serveLegacy; else derived from status
	code    int64  // the JSON-RPC error code answered, if any
	span    trace.Span
	header  http.Header // the request's, for its traceparent
}

// observeStart wraps w when metrics or traces are on.
func (s *Server) observeStart(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *observedWriter) {
	if s.opts.Telemetry == nil && s.tracer == nil {
		return w, nil
	}
	ow := &observedWriter{StatusWriter: telemetry.StatusWriter{ResponseWriter: w}, start: time.Now(), era: "none", header: r.Header}
	return ow, ow
}

// traceStart starts the request's span once the body told whether _meta
// carries a trace context (SEP-414's traceparent and tracestate): a valid
// one is the parent and the traceparent header becomes a link; otherwise
// the header's context is the parent. The span starts when the request
// arrived. Without tracing ctx is returned as it is.
func (s *Server) traceStart(ctx context.Context, w http.ResponseWriter, metaParent, metaState string) context.Context {
	ow, ok := w.(*observedWriter)
	if !ok || s.tracer == nil || ow.span != nil {
		return ctx
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ow.start)}
	parent := tracing.FromHeader(ow.header)
	if meta := tracing.FromMeta(metaParent, metaState); meta.IsValid() {
		if parent.IsValid() && !parent.Equal(meta) {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent,
				Attributes: []attribute.KeyValue{attribute.String("credbroker.link", "http_traceparent")}}))
		}
		parent = meta
	}
	if parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx, ow.span = s.tracer.Start(ctx, "mcp.request", opts...)
	return ctx
}

// traceEnd ends the request's span (started now when the request failed
// before its body was read) with what the request turned out to be.
func (s *Server) traceEnd(ow *observedWriter, outcome string) {
	if s.tracer == nil {
		return
	}
	if ow.span == nil {
		s.traceStart(context.Background(), ow, "", "")
	}
	attrs := []attribute.KeyValue{
		attribute.String("mcp.method", ow.method),
		attribute.String("mcp.era", ow.era),
		attribute.String("mcp.outcome", outcome),
		attribute.Int("http.response.status_code", ow.Status),
	}
	if ow.tool != "" {
		attrs = append(attrs, attribute.String("mcp.tool", ow.tool))
	}
	if ow.code != 0 {
		attrs = append(attrs, attribute.Int64("rpc.jsonrpc.error_code", ow.code))
	}
	ow.span.SetAttributes(attrs...)
	if outcome == telemetry.OutcomeInternal {
		ow.span.SetStatus(codes.Error, outcome)
	}
	ow.span.End()
}

// observeEnd reports the request described by ow.
func (s *Server) observeEnd(ow *observedWriter) {
	if ow == nil {
		return
	}
	outcome := ow.outcome
	switch {
	case ow.Status == http.StatusUnauthorized || ow.Status == http.StatusForbidden:
		outcome = telemetry.OutcomeUnauthorized
	case ow.Status == http.StatusServiceUnavailable && outcome == telemetry.OutcomeUnavailable:
	case ow.Status >= 500:
		outcome = telemetry.OutcomeInternal
	case ow.Status == http.StatusAccepted:
		outcome = telemetry.OutcomeAccepted
	case ow.Status >= 400:
		outcome = telemetry.OutcomeRPCError
	case outcome == "":
		outcome = telemetry.OutcomeComplete
	}
	s.traceEnd(ow, outcome)
	s.opts.Telemetry.MCPRequest(ow.method, ow.tool, ow.era, outcome, time.Since(ow.start))
}

// note records facts about the request on w when it is observed.
func note(w http.ResponseWriter, f func(*observedWriter)) {
	for w != nil {
		if ow, ok := w.(*observedWriter); ok {
			f(ow)
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// legacyOutcome classifies a 2025-11-25 answer the SDK produced (JSON, one
// message) without decoding it.
func legacyOutcome(body []byte) string {
	switch {
	case bytes.Contains(body, []byte(`"code":-32042`)):
		return telemetry.OutcomeInputRequired
	case bytes.Contains(body, []byte(`"error":{`)):
		return telemetry.OutcomeRPCError
	case bytes.Contains(body, []byte(`"isError":true`)):
		return telemetry.OutcomeToolError
	}
	return telemetry.OutcomeComplete
}
