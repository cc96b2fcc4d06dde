package tracing

import (
	"context"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"credbroker/internal/logredact"
)

const redacted = "REDACTED"

// Redacting wraps next so that every span it exports has passed Redact:
// defence in depth behind callers that never set a secret attribute.
func Redacting(next sdktrace.SpanExporter) sdktrace.SpanExporter {
	return &redactingExporter{next: next}
}

type redactingExporter struct{ next sdktrace.SpanExporter }

func (r *redactingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = redactSpan(s)
	}
	return r.next.ExportSpans(ctx, out)
}

func (r *redactingExporter) Shutdown(ctx context.Context) error { return r.next.Shutdown(ctx) }

// redactedSpan is a span with its name, attributes, events, links and
// status description replaced by their redacted copies.
type redactedSpan struct {
	sdktrace.ReadOnlySpan
	name   string
	attrs  []attribute.KeyValue
	events []sdktrace.Event
	links  []sdktrace.Link
	status sdktrace.Status
}

func (s redactedSpan) Name() string                     { return s.name }
func (s redactedSpan) Attributes() []attribute.KeyValue { return s.attrs }
func (s redactedSpan) Events() []sdktrace.Event         { return s.events }
func (s redactedSpan) Links() []sdktrace.Link           { return s.links }
func (s redactedSpan) Status() sdktrace.Status          { return s.status }

func redactSpan(s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	r := redactedSpan{ReadOnlySpan: s, name: logredact.ScrubText(s.Name()), attrs: Redact(s.Attributes()), status: s.Status()}
	r.status.Description = logredact.ScrubText(r.status.Description)
	if ev := s.Events(); len(ev) > 0 {
		r.events = make([]sdktrace.Event, len(ev))
		for i, e := range ev {
			e.Name = logredact.ScrubText(e.Name)
			e.Attributes = Redact(e.Attributes)
			r.events[i] = e
		}
	}
	if ls := s.Links(); len(ls) > 0 {
		r.links = make([]sdktrace.Link, len(ls))
		for i, l := range ls {
			l.Attributes = Redact(l.Attributes)
			r.links[i] = l
		}
	}
	return r
}

// safeKeys are attribute keys that contain a word logredact treats as
// secret (code, state, key) but hold none.
var safeKeys = map[string]bool{
	"http.response.status_code": true, "http.status_code": true,
	"rpc.jsonrpc.error_code": true, "mcp.outcome": true,
	// binding.Ref: a short non-reversible reference that logs carry too.
	"credbroker.grant_ref": true,
}

// identityWords name keys whose values identify a person, a session or a
// connect request: their values are masked whatever they look like.
var identityWords = map[string]bool{
	"principal": true, "sub": true, "subject": true, "iss": true, "issuer": true,
	"enduser": true, "user": true, "grant": true, "session": true, "login": true,
	"email": true, "account": true, "query": true,
}

// urlKeys hold URLs (or targets) that keep scheme, host and path only.
var urlKeys = map[string]bool{"url.full": true, "http.url": true, "http.target": true, "url.original": true}

func identityKey(k string) bool {
	if k == "user_agent.original" {
		return false
	}
	for _, w := range strings.FieldsFunc(strings.ToLower(k), func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
		if identityWords[w] {
			return true
		}
	}
	return false
}

// Redact returns kvs with secrets masked: a key naming a secret or an
// identity (logredact.SensitiveKey, principal, sub, grant, session,
// query, ...) keeps its key with the value REDACTED; a URL keeps scheme,
// host and path; any other string value goes through logredact.ScrubText
// (credentials after a scheme, secret key=value pairs, token shapes, long
// random strings) and loses a URL query wherever one appears.
func Redact(kvs []attribute.KeyValue) []attribute.KeyValue {
	if len(kvs) == 0 {
		return kvs
	}
	out := make([]attribute.KeyValue, len(kvs))
	for i, kv := range kvs {
		out[i] = redactKV(kv)
	}
	return out
}

func redactKV(kv attribute.KeyValue) attribute.KeyValue {
	k := string(kv.Key)
	if safeKeys[k] {
		if kv.Value.Type() == attribute.STRING {
			return attribute.String(k, logredact.ScrubText(kv.Value.AsString()))
		}
		return kv
	}
	if logredact.SensitiveKey(k) || identityKey(k) {
		return attribute.String(k, redacted)
	}
	switch kv.Value.Type() {
	case attribute.STRING:
		v := kv.Value.AsString()
		if urlKeys[k] {
			v = CleanURL(v)
		}
		return attribute.String(k, scrubString(v))
	case attribute.STRINGSLICE:
		vs := kv.Value.AsStringSlice()
		for i := range vs {
			vs[i] = scrubString(vs[i])
		}
		return attribute.StringSlice(k, vs)
	}
	return kv
}

// scrubString masks credentials in free text and drops URL queries and
// fragments.
func scrubString(v string) string {
	v = logredact.ScrubText(v)
	if strings.ContainsAny(v, "?#") {
		v = stripQueries(v)
	}
	return v
}

// stripQueries cuts every "?…" and "#…" up to the next space: whatever
// follows a '?' in a URL-ish word is dropped.
func stripQueries(v string) string {
	var b strings.Builder
	for _, w := range strings.SplitAfter(v, " ") {
		cut := strings.IndexAny(w, "?#")
		if cut >= 0 && (strings.Contains(w[:cut], "/") || strings.Contains(w[cut:], "=")) {
			trail := ""
			if strings.HasSuffix(w, " ") {
				trail = " "
			}
			w = w[:cut] + trail
		}
		b.WriteString(w)
	}
	return b.String()
}

// CleanURL keeps a URL's scheme, host and path: no user information,
// query or fragment. A relative target ("/path?x") keeps its path.
func CleanURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if i := strings.IndexAny(raw, "?#"); i >= 0 {
			return raw[:i]
		}
		return raw
	}
	c := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return c.String()
}
