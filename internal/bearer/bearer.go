// Package bearer establishes who is calling from an OAuth 2.0 bearer
// access token, for every front door of the broker (the MCP endpoint, the
// sidecar API): the Authorization header's one "Bearer <token>", JWT
// validation against the issuer's keys (OIDC discovery, audience, expiry
// with a small leeway), and a bounded cache of verified tokens that keeps
// signature checks off the hot path.
package bearer

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"credbroker/vault"
)

// TokenInfo is what a verified bearer token says about its holder.
type TokenInfo struct {
	Principal vault.Principal
	Scopes    []string
	Expiry    time.Time
	// Audiences are the token's aud claim (at least one of them is an
	// audience the verifier accepts).
	Audiences []string
	// Session and ClientID are set for the broker's own access tokens:
	// the grant (app and token family) that issued the token, which its
	// verifier checks on every use, and the OAuth client it was issued to.
	Session  string
	ClientID string

	// Claims is the verified token's whole claim set (the admin API reads
	// a configured group or role claim from it).
	Claims json.RawMessage
}

// Verifier validates a raw bearer token. Failures that should answer 401
// wrap ErrInvalidToken; others (the issuer unreachable) do not.
type Verifier func(ctx context.Context, rawToken string) (TokenInfo, error)

// ErrInvalidToken is wrapped by every Verifier failure that should answer 401.
var ErrInvalidToken = errors.New("bearer: invalid bearer token")

// clockLeeway tolerates small clock differences between the IdP and the broker.
const clockLeeway = 30 * time.Second

// jwtVerifier validates access tokens issued as JWTs by the configured
// issuer. The provider (OIDC discovery, remote key set) is resolved on first
// use and kept once it succeeds, so the broker starts while the IdP is down.
type jwtVerifier struct {
	issuer   string
	audience string
	client   *http.Client
	now      func() time.Time

	mu       sync.Mutex // guards verifier
	verifier *oidc.IDTokenVerifier
}

func (j *jwtVerifier) get(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.verifier != nil {
		return j.verifier, nil
	}
	dctx, cancel := context.WithTimeout(oidc.ClientContext(context.WithoutCancel(ctx), j.client), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, j.issuer)
	if err != nil {
		return nil, fmt.Errorf("bearer: OIDC discovery for %s: %w", j.issuer, err)
	}
	// The key set outlives this request (VerifierContext ignores cancellation)
	// and fetches keys with the configured client.
	j.verifier = p.VerifierContext(oidc.ClientContext(context.Background(), j.client),
		&oidc.Config{SkipClientIDCheck: true, SkipExpiryCheck: true, Now: j.now})
	return j.verifier, nil
}

type accessClaims struct {
	Subject   string          `json:"sub"`
	Expiry    *float64        `json:"exp"`
	NotBefore *float64        `json:"nbf"`
	Scope     string          `json:"scope"`
	Scp       json.RawMessage `json:"scp"`
}

func (j *jwtVerifier) verify(ctx context.Context, raw string) (TokenInfo, error) {
	v, err := j.get(ctx)
	if err != nil {
		return TokenInfo{}, err
	}
	tok, err := v.Verify(ctx, raw)
	if err != nil {
		return TokenInfo{}, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if !slices.Contains(tok.Audience, j.audience) {
		return TokenInfo{}, fmt.Errorf("%w: audience %q does not name %s", ErrInvalidToken, tok.Audience, j.audience)
	}
	var c accessClaims
	if err := tok.Claims(&c); err != nil {
		return TokenInfo{}, fmt.Errorf("%w: claims: %v", ErrInvalidToken, err)
	}
	now := j.now()
	if c.Expiry == nil {
		return TokenInfo{}, fmt.Errorf("%w: no exp claim", ErrInvalidToken)
	}
	exp := time.Unix(int64(*c.Expiry), 0)
	if !now.Before(exp.Add(clockLeeway)) {
		return TokenInfo{}, fmt.Errorf("%w: expired at %s", ErrInvalidToken, exp.UTC().Format(time.RFC3339))
	}
	if c.NotBefore != nil {
		if nbf := time.Unix(int64(*c.NotBefore), 0); now.Add(clockLeeway).Before(nbf) {
			return TokenInfo{}, fmt.Errorf("%w: not valid before %s", ErrInvalidToken, nbf.UTC().Format(time.RFC3339))
		}
	}
	if tok.Issuer == "" || c.Subject == "" {
		return TokenInfo{}, fmt.Errorf("%w: missing iss or sub", ErrInvalidToken)
	}
	info := TokenInfo{Principal: vault.Principal{Issuer: tok.Issuer, Subject: c.Subject}, Expiry: exp, Audiences: slices.Clone(tok.Audience)}
	_ = tok.Claims(&info.Claims)
	info.Scopes = strings.Fields(c.Scope)
	if len(c.Scp) > 0 {
		var list []string
		var one string
		if json.Unmarshal(c.Scp, &list) == nil {
			info.Scopes = append(info.Scopes, list...)
		} else if json.Unmarshal(c.Scp, &one) == nil {
			info.Scopes = append(info.Scopes, strings.Fields(one)...)
		}
	}
	return info, nil
}

// tokenCache remembers verified tokens by SHA-256 of the token until they
// expire, keeping signature checks off the hot path. Bounded: when full,
// expired entries go first, then arbitrary ones.
type tokenCache struct {
	max int
	now func() time.Time

	mu      sync.Mutex // guards entries
	entries map[[32]byte]TokenInfo
}

func newTokenCache(max int, now func() time.Time) *tokenCache {
	return &tokenCache{max: max, now: now, entries: make(map[[32]byte]TokenInfo)}
}

func (c *tokenCache) get(key [32]byte) (TokenInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	info, ok := c.entries[key]
	if !ok {
		return TokenInfo{}, false
	}
	if !c.now().Before(info.Expiry) {
		delete(c.entries, key)
		return TokenInfo{}, false
	}
	return info, true
}

func (c *tokenCache) put(key [32]byte, info TokenInfo) {
	if info.Expiry.IsZero() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		now := c.now()
		for k, v := range c.entries {
			if !now.Before(v.Expiry) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = info
}

// NewJWTVerifier returns a verifier of JWT access tokens from issuer (keys
// found by OIDC discovery on first use) whose audience names any of
// audiences. Every front door uses it, so a person's identity is always
// established by the broker itself.
func NewJWTVerifier(issuer string, audiences []string, client *http.Client, now func() time.Time) (Verifier, error) {
	if issuer == "" || len(audiences) == 0 {
		return nil, errors.New("bearer: NewJWTVerifier needs an issuer and at least one audience")
	}
	for _, a := range audiences {
		if a == "" {
			return nil, errors.New("bearer: NewJWTVerifier: empty audience")
		}
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	if now == nil {
		now = time.Now
	}
	first := &jwtVerifier{issuer: issuer, audience: audiences[0], client: client, now: now}
	return func(ctx context.Context, raw string) (TokenInfo, error) {
		info, err := first.verify(ctx, raw)
		if err == nil || len(audiences) == 1 || !errors.Is(err, ErrInvalidToken) {
			return info, err
		}
		v, gerr := first.get(ctx)
		if gerr != nil {
			return TokenInfo{}, gerr
		}
		for _, a := range audiences[1:] {
			other := &jwtVerifier{issuer: issuer, audience: a, client: client, now: now, verifier: v}
			if info, oerr := other.verify(ctx, raw); oerr == nil {
				return info, nil
			}
		}
		return TokenInfo{}, fmt.Errorf("%w (accepted audiences: %d)", err, len(audiences))
	}, nil
}

// ErrMalformedHeader: the Authorization header is not exactly one
// "Bearer <token>".
var ErrMalformedHeader = errors.New("bearer: the Authorization header must be one \"Bearer <token>\"")

// FromHeader returns the token of a request's Authorization header
// values: exactly one value, scheme Bearer (any case), one token without
// spaces. No header at all is ErrMissing.
func FromHeader(values []string) (string, error) {
	if len(values) == 0 {
		return "", ErrMissing
	}
	scheme, raw, ok := strings.Cut(values[0], " ")
	raw = strings.TrimSpace(raw)
	// Two byte searches: ContainsAny walks a JWT's hundreds of bytes one
	// at a time, on every request.
	if len(values) != 1 || !ok || !strings.EqualFold(scheme, "Bearer") || raw == "" ||
		strings.IndexByte(raw, ' ') >= 0 || strings.IndexByte(raw, '\t') >= 0 {
		return "", ErrMalformedHeader
	}
	return raw, nil
}

// ErrMissing: the request carries no Authorization header.
var ErrMissing = errors.New("bearer: missing bearer token")

// Cached returns v behind a cache of verified tokens (by SHA-256 of the
// token) that holds at most max entries, each until its token expires.
// Tokens without an expiry are verified every time. A nil now is time.Now.
func Cached(v Verifier, max int, now func() time.Time) Verifier {
	if now == nil {
		now = time.Now
	}
	c := newTokenCache(max, now)
	return func(ctx context.Context, raw string) (TokenInfo, error) {
		key := tokenKey(raw)
		if info, ok := c.get(key); ok {
			return info, nil
		}
		info, err := v(ctx, raw)
		if err != nil {
			return TokenInfo{}, err
		}
		if info.Principal.Issuer == "" || info.Principal.Subject == "" {
			return TokenInfo{}, fmt.Errorf("%w: the token names no issuer or subject", ErrInvalidToken)
		}
		c.put(key, info)
		return info, nil
	}
}

// tokenKey is the cache's key of raw: its SHA-256, hashed from a copy on
// the stack for the usual sizes (a JWT of a few hundred bytes), since a
// []byte conversion of a token of that size allocates on every request.
func tokenKey(raw string) [32]byte {
	var buf [2048]byte
	return sha256.Sum256(append(buf[:0], raw...))
}

// ByIssuer returns a verifier that hands a JWT to the verifier of the
// issuer its (not yet verified) iss claim names, and any other token to
// fallback. Each verifier checks everything itself, so the unverified
// peek only chooses which one does.
func ByIssuer(byIssuer map[string]Verifier, fallback Verifier) Verifier {
	return func(ctx context.Context, raw string) (TokenInfo, error) {
		if v, ok := byIssuer[peekIssuer(raw)]; ok {
			return v(ctx, raw)
		}
		return fallback(ctx, raw)
	}
}

// peekIssuer returns the iss claim of a compact JWS without verifying it,
// or "" when raw is not one.
func peekIssuer(raw string) string {
	parts := strings.Split(raw, ".")
	if len(parts) != 3 || len(parts[1]) > 16<<10 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Issuer string `json:"iss"`
	}
	if json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.Issuer
}
