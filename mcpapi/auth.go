package mcpapi

import (
	"context"
	"crypto/sha256"
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
}

// TokenVerifier validates a raw bearer token. Failures wrap ErrInvalidToken.
type TokenVerifier func(ctx context.Context, rawToken string) (TokenInfo, error)

// ErrInvalidToken is wrapped by every TokenVerifier failure that should answer 401.
var ErrInvalidToken = errors.New("mcpapi: invalid bearer token")

// clockLeeway tolerates small clock differences between the IdP and the broker.
const clockLeeway = 30 * time.Second

type principalKey struct{}

// PrincipalFromContext returns the principal of the validated bearer token
// of the request being served.
func PrincipalFromContext(ctx context.Context) (vault.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(vault.Principal)
	return p, ok && !p.IsZero()
}

func withPrincipal(ctx context.Context, p vault.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

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
		return nil, fmt.Errorf("mcpapi: OIDC discovery for %s: %w", j.issuer, err)
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
	info := TokenInfo{Principal: vault.Principal{Issuer: tok.Issuer, Subject: c.Subject}, Expiry: exp}
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

// authenticate validates the request's bearer token. On failure it writes
// the 401/403 answer and returns false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (TokenInfo, bool) {
	h := r.Header.Values("Authorization")
	if len(h) == 0 {
		s.challenge(w, http.StatusUnauthorized, "", "missing bearer token")
		return TokenInfo{}, false
	}
	scheme, raw, ok := strings.Cut(h[0], " ")
	raw = strings.TrimSpace(raw)
	if len(h) != 1 || !ok || !strings.EqualFold(scheme, "Bearer") || raw == "" || strings.ContainsAny(raw, " \t") {
		s.challenge(w, http.StatusUnauthorized, "invalid_request", "the Authorization header must be one \"Bearer <token>\"")
		return TokenInfo{}, false
	}
	key := sha256.Sum256([]byte(raw))
	info, ok := s.tokens.get(key)
	if !ok {
		var err error
		info, err = s.verifier(r.Context(), raw)
		if err != nil {
			if errors.Is(err, ErrInvalidToken) {
				s.log.Info("mcpapi: bearer token rejected", "reason", err.Error())
				s.challenge(w, http.StatusUnauthorized, "invalid_token", "invalid or expired bearer token")
			} else {
				s.log.Error("mcpapi: bearer token verification failed", "err", err.Error())
				writeRPCError(w, http.StatusServiceUnavailable, nil, codeInternal, "cannot verify bearer tokens right now", nil)
			}
			return TokenInfo{}, false
		}
		if info.Principal.Issuer == "" || info.Principal.Subject == "" {
			s.challenge(w, http.StatusUnauthorized, "invalid_token", "bearer token names no subject")
			return TokenInfo{}, false
		}
		s.tokens.put(key, info)
	}
	if s.opts.RequiredScope != "" && !slices.Contains(info.Scopes, s.opts.RequiredScope) {
		s.challenge(w, http.StatusForbidden, "insufficient_scope", "the bearer token lacks the required scope")
		return TokenInfo{}, false
	}
	return info, true
}

// challenge writes a 401/403 with the RFC 6750 / RFC 9728 WWW-Authenticate
// header and a JSON-RPC error body.
func (s *Server) challenge(w http.ResponseWriter, status int, errCode, msg string) {
	parts := []string{fmt.Sprintf("resource_metadata=%q", s.metadataURL)}
	if s.opts.RequiredScope != "" {
		parts = append(parts, fmt.Sprintf("scope=%q", s.opts.RequiredScope))
	}
	if errCode != "" {
		parts = append([]string{fmt.Sprintf("error=%q", errCode)}, parts...)
	}
	w.Header().Set("WWW-Authenticate", "Bearer "+strings.Join(parts, ", "))
	writeRPCError(w, status, nil, codeInvalidRequest, msg, nil)
}

// protectedResourceMetadata is the RFC 9728 document.
type protectedResourceMetadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported,omitempty"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name,omitempty"`
}

func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Write(s.metadataJSON)
}
