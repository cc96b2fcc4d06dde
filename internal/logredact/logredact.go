// Package logredact provides a slog.Handler that removes secrets before a
// record reaches the output while keeping every message readable: it masks
// values, never words.
//
//   - Attributes whose key names a secret (token, code, secret, password,
//     cookie, authorization, verifier, ...) print "REDACTED".
//   - Values implementing slog.LogValuer (vault.Secret) resolve to
//     "REDACTED" on their own.
//   - Inside messages, string values and error texts, three shapes of
//     secret are masked: the credential after an authorization scheme
//     ("Bearer eyJ…", "token gho_…", but not "bearer token rejected"), the
//     value of a secret-named key=value or "key": "value" pair
//     (access_token=…, "client_secret": "…"), and strings shaped like
//     tokens on their own (JWTs, well-known provider token prefixes such
//     as gho_ or ya29.). Messages and error texts also lose long
//     random-looking strings (32 characters or more of mixed case and
//     digits), which no sentence contains.
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

var (
	// schemeRE finds an authorization scheme and the word after it; the
	// word is masked only when it is shaped like a credential.
	schemeRE = regexp.MustCompile(`(?i)\b(bearer|basic|token|dpop)(\s+)([A-Za-z0-9\-._~+/=]+)`)
	// secretPairRE finds key=value pairs (query strings, form bodies, free
	// text) whose key names a secret; the value is masked whatever it is.
	secretPairRE = regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_])((?:access_token|refresh_token|id_token|token|client_secret|secret|password|code|code_verifier|state|nonce|api_key|apikey|assertion|requeststate|request_state)=)([^&\s"',;]*)`)
	// secretJSONRE finds the same keys as JSON members.
	secretJSONRE = regexp.MustCompile(`(?i)("(?:access_token|refresh_token|id_token|client_secret|password|code_verifier|api_key|apikey|assertion|requestState|request_state)"\s*:\s*")((?:[^"\\]|\\.)*)(")`)
	// tokenShapeRE finds strings that are tokens on their own: JWTs and
	// the documented prefixes of GitHub, Google, Slack and GitLab tokens.
	tokenShapeRE = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*|\b(?:gh[opsur]_|github_pat_|glpat-|xox[abprs]-)[A-Za-z0-9_-]{8,}|\bya29\.[A-Za-z0-9_.-]{8,}|\b1//[A-Za-z0-9_-]{8,}`)
	// opaqueRE finds long runs of base64url characters; opaque reports
	// whether one looks random (mixed case and digits).
	opaqueRE = regexp.MustCompile(`[A-Za-z0-9_\-+/]{32,}=*`)
)

// credentialShaped reports whether w, found after an authorization scheme,
// is a credential rather than a word: credentials carry digits or
// punctuation, or are long.
func credentialShaped(w string) bool {
	if len(w) >= 20 {
		return true
	}
	return len(w) >= 8 && strings.ContainsAny(w, "0123456789-._~+/=")
}

func opaque(s string) bool {
	var upper, lower, digit bool
	for _, r := range s {
		switch {
		case r >= 'A' && r <= 'Z':
			upper = true
		case r >= 'a' && r <= 'z':
			lower = true
		case r >= '0' && r <= '9':
			digit = true
		}
	}
	return upper && lower && digit
}

// Scrub masks the credentials embedded in s (a string attribute value):
// the credential after an authorization scheme, the value of a secret
// key=value or JSON member, and token-shaped strings. The words around
// them stay as they are.
func Scrub(s string) string {
	if !strings.ContainsAny(s, " =:.-_/") {
		return s
	}
	s = schemeRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := schemeRE.FindStringSubmatch(m)
		if !credentialShaped(sub[3]) || sub[3] == redacted {
			return m
		}
		return sub[1] + sub[2] + redacted
	})
	s = secretPairRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := secretPairRE.FindStringSubmatch(m)
		if sub[3] == "" {
			return m
		}
		return sub[1] + sub[2] + redacted
	})
	s = secretJSONRE.ReplaceAllString(s, "${1}"+redacted+"${3}")
	return tokenShapeRE.ReplaceAllString(s, redacted)
}

// ScrubText is Scrub for free text (log messages, error texts), which also
// loses long random-looking strings.
func ScrubText(s string) string {
	s = Scrub(s)
	return opaqueRE.ReplaceAllStringFunc(s, func(m string) string {
		if opaque(m) {
			return redacted
		}
		return m
	})
}

// Handler wraps another slog.Handler and redacts secrets.
type Handler struct{ next slog.Handler }

// New returns a redacting handler in front of next.
func New(next slog.Handler) *Handler { return &Handler{next: next} }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, ScrubText(r.Message), r.PC)
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
			return slog.String(a.Key, ScrubText(err.Error()))
		}
	}
	return a
}
