// Package logredact provides a slog.Handler that removes secrets before a
// record reaches the output: attributes whose key names a secret (token,
// code, secret, password, cookie, authorization, verifier, ...) are replaced
// by "REDACTED", bearer credentials inside string values are masked, and
// values implementing slog.LogValuer (vault.Secret) resolve to "REDACTED" on
// their own.
package logredact

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
)

const redacted = "REDACTED"

// sensitive key fragments, matched case-insensitively against attribute keys
// split on '_', '-' and '.'.
var sensitiveWords = map[string]bool{
	"token": true, "tokens": true, "secret": true, "password": true, "passwd": true,
	"cookie": true, "authorization": true, "code": true, "verifier": true,
	"assertion": true, "credential": true, "credentials": true, "key": true, "keys": true,
	"requeststate": true, "state": true, "nonce": true,
}

// allowed keys that contain a sensitive word but are not secrets.
var allowedKeys = map[string]bool{
	"status_code": true, "code_challenge_method": true, "token_type": true,
	"key_id": true, "grant_state": true, "error_code": true, "http_status_code": true,
}

// SensitiveKey reports whether an attribute key names secret material.
func SensitiveKey(k string) bool {
	lk := strings.ToLower(k)
	if allowedKeys[lk] {
		return false
	}
	for _, w := range strings.FieldsFunc(lk, func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
		if sensitiveWords[w] {
			return true
		}
	}
	return false
}

var bearerRE = regexp.MustCompile(`(?i)\b(bearer|token|basic)\s+[A-Za-z0-9\-._~+/]+=*`)
var queryRE = regexp.MustCompile(`(?i)([?&](?:code|state|access_token|refresh_token|id_token|token|client_secret|code_verifier)=)[^&\s"]*`)

// Scrub masks credentials embedded in free text (Authorization-style values
// and secret query parameters).
func Scrub(s string) string {
	if !strings.ContainsAny(s, " =") {
		return s
	}
	s = bearerRE.ReplaceAllString(s, "$1 "+redacted)
	return queryRE.ReplaceAllString(s, "${1}"+redacted)
}

// Handler wraps another slog.Handler and redacts secrets.
type Handler struct{ next slog.Handler }

// New returns a redacting handler in front of next.
func New(next slog.Handler) *Handler { return &Handler{next: next} }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, Scrub(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(redactAttr(a))
		return true
	})
	return h.next.Handle(ctx, nr)
}

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = redactAttr(a)
	}
	return &Handler{next: h.next.WithAttrs(out)}
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler { return &Handler{next: h.next.WithGroup(name)} }

func redactAttr(a slog.Attr) slog.Attr {
	a.Value = a.Value.Resolve()
	if SensitiveKey(a.Key) {
		return slog.String(a.Key, redacted)
	}
	switch a.Value.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Scrub(a.Value.String()))
	case slog.KindGroup:
		g := a.Value.Group()
		out := make([]any, len(g))
		for i, ga := range g {
			out[i] = redactAttr(ga)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			return slog.String(a.Key, Scrub(err.Error()))
		}
	}
	return a
}
