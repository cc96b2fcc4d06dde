package devidp

import (
	"context"
	"slices"
	"time"

	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Refresh tokens: a sign-in that asked for offline_access (and whose
// client may use the refresh_token grant, which every client here may)
// gets one; each use rotates it (the spent one is refused after, as a
// rotating IdP does); it lives refreshTokenTTL; RevokeRefreshTokens ends a
// user's, as an administrator ending their sessions would.

// refreshGrant is a live refresh token: who, for which client, the
// scopes of the sign-in that issued it.
type refreshGrant struct {
	subject  string
	clientID string
	scopes   []string
	authTime time.Time
	amr      []string
	expiry   time.Time
}

// refreshRequest is a refresh_token grant request (op.RefreshTokenRequest).
type refreshRequest struct {
	token string
	g     refreshGrant
}

func (r *refreshRequest) GetAMR() []string                 { return slices.Clone(r.g.amr) }
func (r *refreshRequest) GetAudience() []string            { return []string{r.g.clientID} }
func (r *refreshRequest) GetAuthTime() time.Time           { return r.g.authTime }
func (r *refreshRequest) GetClientID() string              { return r.g.clientID }
func (r *refreshRequest) GetScopes() []string              { return slices.Clone(r.g.scopes) }
func (r *refreshRequest) GetSubject() string               { return r.g.subject }
func (r *refreshRequest) SetCurrentScopes(scopes []string) { r.g.scopes = slices.Clone(scopes) }

// CreateAccessAndRefreshTokens issues an access token and a refresh token
// (a code flow with offline_access, or a refresh, which rotates: the
// refresh token spent is deleted).
func (s *storage) CreateAccessAndRefreshTokens(ctx context.Context, req op.TokenRequest, current string) (string, string, time.Time, error) {
	id, exp, err := s.CreateAccessToken(ctx, req)
	if err != nil {
		return "", "", time.Time{}, err
	}
	rt, err := randomString(32)
	if err != nil {
		return "", "", time.Time{}, err
	}
	g := refreshGrant{subject: req.GetSubject(), scopes: slices.Clone(req.GetScopes()), expiry: s.now().Add(refreshTokenTTL)}
	switch r := req.(type) {
	case *authRequest:
		g.clientID, g.authTime, g.amr = r.clientID, r.authTime, r.GetAMR()
	case *refreshRequest:
		g.clientID, g.authTime, g.amr = r.g.clientID, r.g.authTime, r.g.amr
	default:
		return "", "", time.Time{}, oidc.ErrUnsupportedGrantType().WithDescription("refresh tokens come from the code flow only")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if current != "" {
		if _, ok := s.refresh[current]; !ok {
			// Spent meanwhile by a concurrent refresh: refuse, as a
			// rotating IdP does.
			return "", "", time.Time{}, oidc.ErrInvalidGrant().WithDescription("the refresh token was used already")
		}
		delete(s.refresh, current)
	}
	s.refresh[rt] = &g
	s.issued = append(s.issued, rt)
	return id, rt, exp, nil
}

// TokenRequestByRefreshToken finds a live refresh token of a user who
// still exists.
func (s *storage) TokenRequestByRefreshToken(_ context.Context, token string) (op.RefreshTokenRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.refresh[token]
	if !ok || s.now().After(g.expiry) {
		return nil, oidc.ErrInvalidGrant().WithDescription("the refresh token is unknown, revoked or expired")
	}
	if _, ok := s.userBySubject(g.subject); !ok {
		return nil, oidc.ErrInvalidGrant().WithDescription("the user no longer exists")
	}
	return &refreshRequest{token: token, g: *g}, nil
}

// RevokeRefreshTokens ends every refresh token of username (the IdP no
// longer vouching for them, a session ended by an administrator): the
// next refresh is invalid_grant. It returns how many it ended.
func (p *IdP) RevokeRefreshTokens(username string) int {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	u, ok := p.store.users[username]
	n := 0
	for rt, g := range p.store.refresh {
		if ok && g.subject == u.Subject {
			delete(p.store.refresh, rt)
			n++
		}
	}
	return n
}

// IssuedRefreshTokens returns every refresh token the IdP has issued,
// rotated ones included, so tests can look for them where they must
// never be.
func (p *IdP) IssuedRefreshTokens() []string {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	return slices.Clone(p.store.issued)
}
