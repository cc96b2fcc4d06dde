package logredact

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"credbroker/vault"
)

func TestHandlerRedacts(t *testing.T) {
	const tok = "gho_SuperSecretTokenValue123"
	const jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXZhbHVl"
	const opaqueTok = "Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jKa" // 32 random-looking characters
	tests := []struct {
		name, secret string
		log          func(l *slog.Logger)
	}{
		{"secret key", tok, func(l *slog.Logger) { l.Info("x", "access_token", tok) }},
		{"refresh key", tok, func(l *slog.Logger) { l.Info("x", "refresh_token", tok) }},
		{"code key", tok, func(l *slog.Logger) { l.Info("x", "code", tok) }},
		{"client secret", tok, func(l *slog.Logger) { l.Info("x", "client-secret", tok) }},
		{"vault secret value", tok, func(l *slog.Logger) { l.Info("x", "value", vault.Secret(tok)) }},
		{"bearer in message", tok, func(l *slog.Logger) { l.Info("sent Authorization: Bearer " + tok) }},
		{"bearer jwt in message", jwt, func(l *slog.Logger) { l.Info("sent Authorization: Bearer " + jwt) }},
		{"bearer in value", tok, func(l *slog.Logger) { l.Info("x", "header", "Bearer "+tok) }},
		{"short bearer with digits", "abc12345", func(l *slog.Logger) { l.Info("x", "header", "Bearer abc12345") }},
		{"query in url", tok, func(l *slog.Logger) { l.Info("x", "url", "https://x/cb?state=abc&code="+tok) }},
		{"form body in error", "s3cr3t-value", func(l *slog.Logger) {
			l.Info("x", "err", errors.New("POST /token: grant_type=refresh_token&refresh_token=s3cr3t-value&client_id=x"))
		}},
		{"json member in error", "plain-looking", func(l *slog.Logger) {
			l.Info("x", "err", errors.New(`unexpected answer {"access_token":"plain-looking","token_type":"bearer"}`))
		}},
		{"error text", tok, func(l *slog.Logger) { l.Info("x", "err", errors.New("exchange failed: token "+tok)) }},
		{"token shape alone in message", tok, func(l *slog.Logger) { l.Info("the provider answered " + tok) }},
		{"jwt alone in value", jwt, func(l *slog.Logger) { l.Info("x", "detail", "got "+jwt+" back") }},
		{"google token in value", "ya29.a0AfH6SMBx-example", func(l *slog.Logger) { l.Info("x", "detail", "ya29.a0AfH6SMBx-example") }},
		{"opaque string in message", opaqueTok, func(l *slog.Logger) { l.Info("unexpected value " + opaqueTok) }},
		{"opaque string in error", opaqueTok, func(l *slog.Logger) { l.Info("x", "err", errors.New("bad "+opaqueTok)) }},
		{"group", tok, func(l *slog.Logger) { l.Info("x", slog.Group("req", "cookie", tok)) }},
		{"with attrs", tok, func(l *slog.Logger) { l.With("id_token", tok).Info("x") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mk := range []func(*bytes.Buffer) slog.Handler{
				func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
				func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			} {
				var buf bytes.Buffer
				tt.log(slog.New(New(mk(&buf))))
				if strings.Contains(buf.String(), tt.secret) {
					t.Fatalf("secret leaked: %s", buf.String())
				}
				if !strings.Contains(buf.String(), redacted) {
					t.Fatalf("no REDACTED marker: %s", buf.String())
				}
			}
		})
	}
}

// TestMessagesStayReadable pins the exact text of messages whose words
// look like the secrets they talk about: masking is for values, so these
// reach the log unchanged.
func TestMessagesStayReadable(t *testing.T) {
	for _, msg := range []string{
		"sidecar: user token rejected",
		"sidecar: token export refused",
		"mcpapi: bearer token rejected",
		"broker sign-in: ID token rejected",
		"provider: token refresh failed; the stored token stays usable",
		"connections: access token exported",
		"the bearer token has expired",
		"token exchange failed",
		"Basic authentication is not supported",
	} {
		t.Run(msg, func(t *testing.T) {
			var buf bytes.Buffer
			slog.New(New(slog.NewJSONHandler(&buf, nil))).Info(msg)
			var rec struct{ Msg string }
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Msg != msg {
				t.Fatalf("logged %q, want %q", rec.Msg, msg)
			}
		})
	}
}

func TestHandlerKeepsOrdinaryAttrs(t *testing.T) {
	var buf bytes.Buffer
	const sub = "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ" // a pairwise subject: an identifier, not a secret
	slog.New(New(slog.NewTextHandler(&buf, nil))).Info("connected", "provider", "github", "status_code", 200,
		"token_type", "bearer", "grant", "abc", "connection", "conn_Qm9vbGVhbkZhbHNlVHJ1ZQ", "sub", sub,
		"reason", "bearer token rejected: token is expired", "url", "https://broker.example/connect/Qm9vbGVhbkZhbHNlVHJ1ZQ")
	out := buf.String()
	for _, want := range []string{"provider=github", "status_code=200", "token_type=bearer", "grant=abc", "msg=connected",
		"connection=conn_Qm9vbGVhbkZhbHNlVHJ1ZQ", "sub=" + sub, `reason="bearer token rejected: token is expired"`,
		"url=https://broker.example/connect/Qm9vbGVhbkZhbHNlVHJ1ZQ"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in %s", want, out)
		}
	}
	if strings.Contains(out, redacted) {
		t.Errorf("something was masked: %s", out)
	}
}

func FuzzScrub(f *testing.F) {
	for _, s := range []string{"Bearer abc.def-123", "x?code=1&state=2", `{"access_token":"v"}`, "token rejected", "eyJa.eyJb.c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := ScrubText(s)
		// Masking is idempotent: a scrubbed text scrubs to itself.
		if again := ScrubText(out); again != out {
			t.Fatalf("ScrubText not idempotent: %q -> %q -> %q", s, out, again)
		}
	})
}
