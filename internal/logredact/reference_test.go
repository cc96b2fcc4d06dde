package logredact

import (
	"context"
	"log/slog"
	"strings"
)

// This file keeps the straightforward implementation the package started
// with: every pattern run over every string, every record rebuilt. The
// tests in equivalence_test.go hold the optimised code to it byte for byte.

func refSensitiveKey(k string) bool {
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

func refScrub(s string) string {
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

func refScrubText(s string) string {
	s = refScrub(s)
	return opaqueRE.ReplaceAllStringFunc(s, func(m string) string {
		if opaque(m) {
			return redacted
		}
		return m
	})
}

type refHandler struct{ next slog.Handler }

func (h *refHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *refHandler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, refScrubText(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(refRedactAttr(a))
		return true
	})
	return h.next.Handle(ctx, nr)
}

func (h *refHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = refRedactAttr(a)
	}
	return &refHandler{next: h.next.WithAttrs(out)}
}

func (h *refHandler) WithGroup(name string) slog.Handler {
	return &refHandler{next: h.next.WithGroup(name)}
}

func refRedactAttr(a slog.Attr) slog.Attr {
	a.Value = a.Value.Resolve()
	if refSensitiveKey(a.Key) {
		return slog.String(a.Key, redacted)
	}
	switch a.Value.Kind() {
	case slog.KindString:
		return slog.String(a.Key, refScrub(a.Value.String()))
	case slog.KindGroup:
		g := a.Value.Group()
		out := make([]any, len(g))
		for i, ga := range g {
			out[i] = refRedactAttr(ga)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			return slog.String(a.Key, refScrubText(err.Error()))
		}
	}
	return a
}
