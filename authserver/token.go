package authserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"credbroker/apps"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

const (
	// refreshPrefix marks the broker's refresh tokens (and lets secret
	// scanners find leaked ones). The token is
	// cbrt1.<app access id>.<family id>.<256 random bits>.
	refreshPrefix = "cbrt1."
)

// tokenResponse is RFC 6749 section 5.1's answer.
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	RefreshToken string `json:"refresh_token,omitempty"`
	Scope        string `json:"scope,omitempty"`
	// Resource is the granted resource of a JWT bearer grant whose ID-JAG
	// named one (the ID-JAG draft's processing rules).
	Resource string `json:"resource,omitempty"`
}

// handleToken is POST /token.
func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	form, c, e := s.clientRequest(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	var resp tokenResponse
	switch gt := form.Get("grant_type"); gt {
	case grantCode:
		resp, e = s.codeGrant(r.Context(), c, form)
	case grantRefresh:
		resp, e = s.refreshGrant(r.Context(), c, form)
	case grantJWTBearer:
		resp, e = s.jwtBearerGrant(r.Context(), c, form)
	case "":
		e = oerr(http.StatusBadRequest, "invalid_request", "grant_type is required")
	default:
		e = oerr(http.StatusBadRequest, "unsupported_grant_type", "grant_type must be %s", s.grantTypesText())
	}
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// validVerifier checks RFC 7636 section 4.1's code_verifier syntax.
func validVerifier(v string) bool {
	if len(v) < 43 || len(v) > 128 {
		return false
	}
	for _, c := range v {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
			return false
		}
	}
	return true
}

// requestedResource applies RFC 8707 to a token request: an absent
// resource is "" (the grant's); one that is not the broker's is
// invalid_target, before anything is spent.
func (s *Server) requestedResource(form url.Values) (string, *oauthError) {
	raw, ok := form["resource"]
	if !ok {
		return "", nil
	}
	r, ok := s.resourceOf(raw[0])
	if !ok {
		return "", oerr(http.StatusBadRequest, "invalid_target", "%s", s.resourceHint())
	}
	return r, nil
}

// grantedResource checks a requested resource (requestedResource) against
// the one a grant is for.
func grantedResource(requested, granted string) *oauthError {
	if requested != "" && requested != granted {
		return oerr(http.StatusBadRequest, "invalid_target", "resource must be the one this grant is for, %s", granted)
	}
	return nil
}

// codeGrant redeems an authorization code (RFC 6749 section 4.1.3, PKCE).
func (s *Server) codeGrant(ctx context.Context, c *client, form url.Values) (tokenResponse, *oauthError) {
	code, verifier := form.Get("code"), form.Get("code_verifier")
	switch {
	case code == "":
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_request", "code is required")
	case verifier == "":
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_request", "code_verifier is required (PKCE)")
	case !validVerifier(verifier):
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_request", "code_verifier must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~")
	}
	resource, e := s.requestedResource(form)
	if e != nil {
		return tokenResponse{}, e
	}
	// Redeeming marks the code used whatever follows: a code is tried once.
	ac, err := s.store.RedeemAuthCode(ctx, vault.SecretKey(code))
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "unknown authorization code")
	case errors.Is(err, vault.ErrCodeRedeemed):
		// A code presented twice was intercepted or replayed: what the
		// first redemption issued is revoked (RFC 6749 section 4.1.2).
		removed, err := s.apps.EndFamily(ctx, ac.AppID, ac.FamilyID)
		if err != nil {
			s.log.Error("authserver: revoking a token family failed", "app", ac.AppID, "err", err)
		}
		s.log.Warn("security event", "event", "code_replayed", "client_id", c.ID, "tokens_revoked", removed)
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventTokenReplay, Principal: ac.Principal, Client: ac.ClientID, Outcome: "code_replayed"})
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "authorization code already used; the tokens issued for it are revoked")
	case err != nil:
		return tokenResponse{}, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the code could not be redeemed", Err: err}
	}
	now := s.now()
	switch {
	case !now.Before(ac.Expires):
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "authorization code expired")
	case ac.ClientID != c.ID:
		s.log.Warn("security event", "event", "code_of_another_client", "client_id", c.ID)
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "authorization code was issued to another client")
	case form.Has("redirect_uri") && form.Get("redirect_uri") != ac.RedirectURI:
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "redirect_uri differs from the authorization request's")
	case !pkceMatches(verifier, ac.Challenge):
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "code_verifier does not match the code_challenge")
	}
	if e := grantedResource(resource, ac.Resource); e != nil {
		return tokenResponse{}, e
	}
	var rt, rtHash string
	if slices.Contains(c.GrantTypes, grantRefresh) {
		rt = refreshPrefix + ac.AppID + "." + ac.FamilyID + "." + randomID(32)
		rtHash = vault.SecretKey(rt)
	}
	fam := s.policy.NewFamily(ac.FamilyID, ac.Scopes, ac.Resource, rtHash, now)
	app, err := s.apps.AddFamily(ctx, ac.AppID, ac.Principal, ac.ClientID, fam)
	switch {
	case errors.Is(err, apps.ErrRemoved):
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "the person removed this app's access")
	case err != nil:
		return tokenResponse{}, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the tokens could not be recorded", Err: err}
	}
	if c.registered && c.used.IsZero() {
		// A registered client that redeems a code is in use: it no longer
		// expires as unused. Best effort: the tokens are issued either way.
		if _, err := s.store.UpdateOAuthClient(ctx, c.ID, func(oc vault.OAuthClient) (vault.OAuthClient, error) {
			if oc.Used.IsZero() {
				oc.Used = now
			}
			return oc, nil
		}); err != nil {
			s.log.Warn("authserver: could not mark client used", "client_id", c.ID, "err", err)
		}
	}
	return s.tokens(app, fam, ac.Scopes, rt)
}

// pkceMatches checks an S256 code_verifier against the challenge.
func pkceMatches(verifier, challenge string) bool {
	sum := sha256.Sum256([]byte(verifier))
	got := base64.RawURLEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(got), []byte(challenge)) == 1
}

// tokens signs an access token of fam for app and renders the answer.
func (s *Server) tokens(app vault.AppAccess, fam vault.TokenFamily, scopes []string, refresh string) (tokenResponse, *oauthError) {
	now := s.now()
	exp := now.Add(s.policy.AccessTokenTTL)
	if fam.Expires.Before(exp) {
		exp = fam.Expires
	}
	at, err := s.keys.sign(accessClaims{
		Issuer: s.opts.PublicURL, Subject: app.Principal.Subject,
		SubID:    subjectID{Format: "iss_sub", Issuer: app.Principal.Issuer, Subject: app.Principal.Subject},
		Audience: []string{fam.Resource}, ClientID: app.ClientID, Scope: strings.Join(scopes, " "),
		IssuedAt: now.Unix(), Expiry: exp.Unix(), ID: randomID(16), Session: app.ID + "." + fam.ID,
	})
	if err != nil {
		return tokenResponse{}, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the access token could not be signed", Err: err}
	}
	return tokenResponse{
		AccessToken: at, TokenType: "Bearer", ExpiresIn: int64(exp.Sub(now) / time.Second),
		RefreshToken: refresh, Scope: strings.Join(scopes, " "),
	}, nil
}

// parseRefresh splits a refresh token into its app access and family ids.
func parseRefresh(rt string) (appID, famID string, ok bool) {
	rest, ok := strings.CutPrefix(rt, refreshPrefix)
	if !ok || len(rt) > 512 {
		return "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// refreshGrant rotates a refresh token (RFC 6749 section 6): the presented
// token is spent, a new one replaces it, and presenting a spent one again
// revokes the whole family. The check and the rotation are one
// compare-and-swap on the app access record, so a token is spent once
// across every replica sharing the store.
func (s *Server) refreshGrant(ctx context.Context, c *client, form url.Values) (tokenResponse, *oauthError) {
	rt := form.Get("refresh_token")
	if rt == "" {
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_request", "refresh_token is required")
	}
	if !slices.Contains(c.GrantTypes, grantRefresh) {
		return tokenResponse{}, oerr(http.StatusBadRequest, "unauthorized_client", "this client is not registered for the refresh_token grant")
	}
	resource, e := s.requestedResource(form)
	if e != nil {
		return tokenResponse{}, e
	}
	appID, famID, ok := parseRefresh(rt)
	if !ok {
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "unknown refresh token")
	}
	if resource != "" {
		// Checked before the rotation, which spends the token.
		if a, err := s.store.GetAppAccess(ctx, appID); err == nil {
			for _, f := range a.Families {
				if f.ID == famID {
					if e := grantedResource(resource, f.Resource); e != nil {
						return tokenResponse{}, e
					}
				}
			}
		}
	}
	next := refreshPrefix + appID + "." + famID + "." + randomID(32)
	app, fam, outcome, err := s.apps.Rotate(ctx, appID, apps.Refresh{FamilyID: famID, Presented: vault.SecretKey(rt), Next: vault.SecretKey(next), ClientID: c.ID})
	if err != nil {
		return tokenResponse{}, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the refresh token could not be rotated", Err: err}
	}
	switch outcome {
	case apps.Unknown:
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "unknown or revoked refresh token")
	case apps.Replayed:
		s.log.Warn("security event", "event", "refresh_token_replayed", "client_id", c.ID, "app", appID)
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "refresh token already used; every token of this sign-in is revoked, sign in again")
	case apps.WrongClient:
		s.log.Warn("security event", "event", "refresh_token_of_another_client", "client_id", c.ID, "app", appID)
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "refresh token was issued to another client; it is revoked")
	case apps.Expired:
		return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_grant", "refresh token expired; sign in again")
	}
	scopes := fam.Scopes
	if raw, ok := form["scope"]; ok {
		scopes = strings.Fields(raw[0])
		for _, sc := range scopes {
			if !slices.Contains(fam.Scopes, sc) {
				return tokenResponse{}, oerr(http.StatusBadRequest, "invalid_scope", "a refresh cannot add scope %s", untrustedName(sc))
			}
		}
	}
	return s.tokens(app, fam, scopes, next)
}

// MintAccessToken issues an access token for p to the built-in client
// clientID (named name on "My connections") without a browser step, for
// resource (the MCP endpoint when "", or a gateway endpoint). It is
// for trusted in-process callers only: broker dev's POST /dev/token.
func (s *Server) MintAccessToken(ctx context.Context, p vault.Principal, clientID, name, resource string, ttl time.Duration) (string, time.Time, error) {
	now := s.now()
	switch r, ok := s.resourceOf(resource); {
	case resource == "":
		resource = s.opts.Resource
	case !ok:
		return "", time.Time{}, fmt.Errorf("authserver: %q is not a resource of this broker", resource)
	default:
		resource = r
	}
	fam := vault.TokenFamily{ID: randomID(16), Resource: resource, Created: now, Expires: now.Add(ttl)}
	app, err := s.apps.AddFamilyWithoutConsent(ctx, p, clientID, name, fam)
	if err != nil {
		return "", time.Time{}, err
	}
	resp, e := s.tokens(app, fam, nil, "")
	if e != nil {
		return "", time.Time{}, fmt.Errorf("authserver: %w", e.Err)
	}
	return resp.AccessToken, now.Add(time.Duration(resp.ExpiresIn) * time.Second), nil
}
