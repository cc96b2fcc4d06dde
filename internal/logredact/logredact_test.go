package logredact

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"credbroker/vault"
)

func TestHandlerRedacts(t *testing.T) {
	const tok = "gho_SuperSecretTokenValue123"
	tests := []struct {
		name string
		log  func(l *slog.Logger)
	}{
		{"secret key", func(l *slog.Logger) { l.Info("x", "access_token", tok) }},
		{"refresh key", func(l *slog.Logger) { l.Info("x", "refresh_token", tok) }},
		{"code key", func(l *slog.Logger) { l.Info("x", "code", tok) }},
		{"client secret", func(l *slog.Logger) { l.Info("x", "client-secret", tok) }},
		{"vault secret value", func(l *slog.Logger) { l.Info("x", "value", vault.Secret(tok)) }},
		{"bearer in message", func(l *slog.Logger) { l.Info("sent Authorization: Bearer " + tok) }},
		{"bearer in value", func(l *slog.Logger) { l.Info("x", "header", "Bearer "+tok) }},
		{"query in url", func(l *slog.Logger) { l.Info("x", "url", "https://x/cb?state=abc&code="+tok) }},
		{"error text", func(l *slog.Logger) { l.Info("x", "err", errors.New("exchange failed: token "+tok)) }},
		{"group", func(l *slog.Logger) { l.Info("x", slog.Group("req", "cookie", tok)) }},
		{"with attrs", func(l *slog.Logger) { l.With("id_token", tok).Info("x") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mk := range []func(*bytes.Buffer) slog.Handler{
				func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
				func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			} {
				var buf bytes.Buffer
				tt.log(slog.New(New(mk(&buf))))
				if strings.Contains(buf.String(), tok) {
					t.Fatalf("token leaked: %s", buf.String())
				}
				if !strings.Contains(buf.String(), redacted) {
					t.Fatalf("no REDACTED marker: %s", buf.String())
				}
			}
		})
	}
}

func TestHandlerKeepsOrdinaryAttrs(t *testing.T) {
	var buf bytes.Buffer
	slog.New(New(slog.NewTextHandler(&buf, nil))).Info("connected", "provider", "github", "status_code", 200, "token_type", "bearer", "grant", "abc")
	out := buf.String()
	for _, want := range []string{"provider=github", "status_code=200", "token_type=bearer", "grant=abc", "msg=connected"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in %s", want, out)
		}
	}
}
