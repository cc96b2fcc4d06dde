package bearer

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/vault"
)

var epoch = time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)

func TestFromHeader(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"none", nil, "", ErrMissing},
		{"bearer", []string{"Bearer abc.def"}, "abc.def", nil},
		{"scheme in any case", []string{"bEaReR abc"}, "abc", nil},
		{"basic", []string{"Basic abc"}, "", ErrMalformedHeader},
		{"two headers", []string{"Bearer a", "Bearer b"}, "", ErrMalformedHeader},
		{"two tokens", []string{"Bearer a b"}, "", ErrMalformedHeader},
		{"tab in token", []string{"Bearer a\tb"}, "", ErrMalformedHeader},
		{"empty token", []string{"Bearer "}, "", ErrMalformedHeader},
		{"no space", []string{"Bearerabc"}, "", ErrMalformedHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromHeader(tt.values)
			if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("FromHeader(%q) = %q, %v; want %q, %v", tt.values, got, err, tt.want, tt.err)
			}
		})
	}
}

func FuzzFromHeader(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer  x ", "Basic a", "Bearer\x00a", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		tok, err := FromHeader([]string{v})
		if err == nil && (tok == "" || len(tok) >= len(v)) {
			t.Fatalf("FromHeader(%q) = %q", v, tok)
		}
	})
}

func TestTokenCacheIsBounded(t *testing.T) {
	c := newTokenCache(4, func() time.Time { return epoch })
	for i := range 10 {
		c.put([32]byte{byte(i)}, TokenInfo{Expiry: epoch.Add(time.Hour)})
	}
	if len(c.entries) > 4 {
		t.Fatalf("%d entries", len(c.entries))
	}
}

func TestCached(t *testing.T) {
	now := epoch
	var calls atomic.Int32
	v := Cached(func(_ context.Context, raw string) (TokenInfo, error) {
		calls.Add(1)
		switch raw {
		case "good":
			return TokenInfo{Principal: vault.Principal{Issuer: "i", Subject: "s"}, Expiry: epoch.Add(time.Minute)}, nil
		case "anonymous":
			return TokenInfo{Expiry: epoch.Add(time.Minute)}, nil
		}
		return TokenInfo{}, ErrInvalidToken
	}, 10, func() time.Time { return now })
	ctx := context.Background()
	for range 3 {
		if _, err := v(ctx, "good"); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("verified %d times, want once while cached", calls.Load())
	}
	now = epoch.Add(2 * time.Minute)
	if _, err := v(ctx, "good"); err != nil || calls.Load() != 2 {
		t.Fatalf("after expiry: %v, %d verifications", err, calls.Load())
	}
	for range 2 {
		if _, err := v(ctx, "bad"); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("bad token: %v", err)
		}
	}
	if calls.Load() != 4 {
		t.Fatalf("a refused token was cached (%d verifications)", calls.Load())
	}
	if _, err := v(ctx, "anonymous"); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a token naming nobody: %v", err)
	}
}

func TestByIssuer(t *testing.T) {
	mk := func(name string) Verifier {
		return func(ctx context.Context, raw string) (TokenInfo, error) {
			return TokenInfo{Principal: vault.Principal{Issuer: name, Subject: raw}}, nil
		}
	}
	jwt := func(payload string) string {
		return "eyJhbGciOiJFUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + ".sig"
	}
	v := ByIssuer(map[string]Verifier{"https://broker.example": mk("broker")}, mk("idp"))
	for _, tc := range []struct{ raw, want string }{
		{jwt(`{"iss":"https://broker.example","sub":"a"}`), "broker"},
		{jwt(`{"iss":"https://idp.example"}`), "idp"},
		{jwt(`{"iss":"https://broker.example/"}`), "idp"},
		{"opaque-token", "idp"},
		{"a.b.c", "idp"},
		{jwt(`not json`), "idp"},
	} {
		info, err := v(context.Background(), tc.raw)
		if err != nil || info.Principal.Issuer != tc.want {
			t.Errorf("%q went to %q (%v), want %q", tc.raw, info.Principal.Issuer, err, tc.want)
		}
	}
}

// TestTokenKey: the cache's key is the token's SHA-256 for every size,
// past the stack buffer too.
func TestTokenKey(t *testing.T) {
	for _, n := range []int{0, 1, 600, 2048, 2049, 10000} {
		raw := strings.Repeat("x", n)
		if tokenKey(raw) != sha256.Sum256([]byte(raw)) {
			t.Errorf("tokenKey of %d bytes is not its SHA-256", n)
		}
	}
}
