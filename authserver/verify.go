package authserver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"credbroker/apps"
	"credbroker/internal/bearer"
	"credbroker/vault"
)

// clockLeeway tolerates small clock differences between replicas.
const clockLeeway = 30 * time.Second

// Verifier returns the bearer.Verifier of the broker's own access tokens,
// for every front door that accepts them (the MCP endpoint, the sidecar
// API). The signature and claims of a token are checked once and cached;
// that its token family still exists (the app was not removed, the token
// was not revoked, no replay revoked it) is checked on every use by the
// apps core (apps.Service.Alive: its cache where it can be trusted, else
// the store), so a revocation on one replica holds on all of them within
// apps.Bound.
func (s *Server) Verifier() bearer.Verifier { return s.VerifierFor(s.opts.Resource) }

// VerifierFor is Verifier for tokens of resource (a gateway endpoint): a
// token for another resource of the broker is refused.
func (s *Server) VerifierFor(resource string) bearer.Verifier {
	signed := bearer.Cached(func(ctx context.Context, raw string) (bearer.TokenInfo, error) {
		return s.verifySigned(ctx, raw, resource)
	}, 10000, s.now)
	return func(ctx context.Context, raw string) (bearer.TokenInfo, error) {
		info, err := signed(ctx, raw)
		if err != nil {
			return bearer.TokenInfo{}, err
		}
		appID, famID, _ := strings.Cut(info.Session, ".")
		expires, err := s.apps.Alive(ctx, info.Principal, appID, famID)
		switch {
		case errors.Is(err, apps.ErrAppGone):
			return bearer.TokenInfo{}, fmt.Errorf("%w: the app's access was removed", bearer.ErrInvalidToken)
		case errors.Is(err, apps.ErrFamilyEnded):
			return bearer.TokenInfo{}, fmt.Errorf("%w: the token was revoked", bearer.ErrInvalidToken)
		case errors.Is(err, apps.ErrNotTheirs):
			return bearer.TokenInfo{}, fmt.Errorf("%w: the token's person does not match its grant", bearer.ErrInvalidToken)
		case err != nil:
			return bearer.TokenInfo{}, fmt.Errorf("authserver: check token family: %w", err)
		case !s.now().Before(expires.Add(clockLeeway)):
			return bearer.TokenInfo{}, fmt.Errorf("%w: the token's sign-in has ended", bearer.ErrInvalidToken)
		}
		return info, nil
	}
}

// verifySigned checks a token's signature and claims: issued by this
// broker, for resource, unexpired, naming a person of the configured
// IdP.
func (s *Server) verifySigned(_ context.Context, raw, resource string) (bearer.TokenInfo, error) {
	c, err := s.keys.parse(raw)
	if err != nil {
		return bearer.TokenInfo{}, fmt.Errorf("%w: %v", bearer.ErrInvalidToken, err)
	}
	now := s.now()
	switch {
	case c.Issuer != s.opts.PublicURL:
		return bearer.TokenInfo{}, fmt.Errorf("%w: issuer %q is not this broker", bearer.ErrInvalidToken, c.Issuer)
	case !slices.Contains([]string(c.Audience), resource):
		return bearer.TokenInfo{}, fmt.Errorf("%w: audience does not name %s", bearer.ErrInvalidToken, resource)
	case !now.Before(c.expiry().Add(clockLeeway)):
		return bearer.TokenInfo{}, fmt.Errorf("%w: expired at %s", bearer.ErrInvalidToken, c.expiry().UTC().Format(time.RFC3339))
	case time.Unix(c.IssuedAt, 0).After(now.Add(clockLeeway)):
		return bearer.TokenInfo{}, fmt.Errorf("%w: issued in the future", bearer.ErrInvalidToken)
	case c.SubID.Format != "iss_sub" || !slices.Contains(s.trusted, c.SubID.Issuer) || c.SubID.Subject == "" || c.SubID.Subject != c.Subject:
		return bearer.TokenInfo{}, fmt.Errorf("%w: the token does not name a person of this broker's identity provider", bearer.ErrInvalidToken)
	case c.ClientID == "" || !strings.Contains(c.Session, "."):
		return bearer.TokenInfo{}, fmt.Errorf("%w: no client or grant", bearer.ErrInvalidToken)
	}
	return bearer.TokenInfo{
		Principal: vault.Principal{Issuer: c.SubID.Issuer, Subject: c.SubID.Subject},
		Scopes:    strings.Fields(c.Scope), Expiry: c.expiry(), Audiences: []string(c.Audience),
		Session: c.Session, ClientID: c.ClientID,
	}, nil
}
