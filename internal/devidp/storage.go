package devidp

import (
	"context"
	"crypto/rsa"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

const (
	authRequestTTL = 10 * time.Minute
	accessTokenTTL = time.Hour
	idTokenTTL     = time.Hour
	// refreshTokenTTL is how long a refresh token (offline_access) lives;
	// each use rotates it.
	refreshTokenTTL = 24 * time.Hour
)

var errNotFound = errors.New("devidp: not found")

// authRequest is one pending or completed authorization request.
type authRequest struct {
	id           string
	clientID     string
	redirectURI  string
	scopes       []string
	state        string
	nonce        string
	responseType oidc.ResponseType
	responseMode oidc.ResponseMode
	challenge    *oidc.CodeChallenge
	prompt       []string
	maxAge       *uint
	created      time.Time

	// Set by a successful sign-in.
	subject  string
	authTime time.Time
	done     bool
}

var _ op.AuthRequest = (*authRequest)(nil)

func (a *authRequest) GetID() string                         { return a.id }
func (a *authRequest) GetACR() string                        { return "" }
func (a *authRequest) GetAMR() []string                      { return []string{"pwd"} }
func (a *authRequest) GetAudience() []string                 { return []string{a.clientID} }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.challenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.responseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.responseMode }
func (a *authRequest) GetScopes() []string                   { return slices.Clone(a.scopes) }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.subject }
func (a *authRequest) Done() bool                            { return a.done }

// forceLogin reports whether the request asked for the form even when a
// session exists (prompt=login or max_age=0).
func (a *authRequest) forceLogin() bool {
	return slices.Contains(a.prompt, oidc.PromptLogin) || (a.maxAge != nil && *a.maxAge == 0)
}

func (a *authRequest) promptNone() bool { return slices.Contains(a.prompt, oidc.PromptNone) }

// client adapts a Client to op.Client.
type client struct {
	c        Client
	loginURL func(id string) string
}

var _ op.Client = (*client)(nil)

func (c *client) GetID() string                    { return c.c.ID }
func (c *client) RedirectURIs() []string           { return slices.Clone(c.c.RedirectURIs) }
func (c *client) PostLogoutRedirectURIs() []string { return nil }
func (c *client) public() bool                     { return c.c.Secret == "" }

// ApplicationType: confidential clients are web applications (exact redirect
// URI match) unless marked Native; public clients are native applications,
// for which the library accepts a registered loopback redirect URI on any
// port (RFC 8252, 7.3).
func (c *client) ApplicationType() op.ApplicationType {
	if c.public() || c.c.Native {
		return op.ApplicationTypeNative
	}
	return op.ApplicationTypeWeb
}

func (c *client) AuthMethod() oidc.AuthMethod {
	if c.public() {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}

func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken}
}
func (c *client) LoginURL(id string) string           { return c.loginURL(id) }
func (c *client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeBearer }
func (c *client) IDTokenLifetime() time.Duration      { return idTokenTTL }
func (c *client) DevMode() bool                       { return false }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(string) bool { return false }

// IDTokenUserinfoClaimsAssertion is true so that ID tokens carry email and
// name even when an access token is issued alongside.
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c *client) ClockSkew() time.Duration             { return 0 }

// accessToken is an issued opaque access token.
type accessToken struct {
	subject  string
	clientID string
	scopes   []string
	expiry   time.Time
}

// storage is the in-memory op.Storage of one IdP.
type storage struct {
	key      *rsa.PrivateKey
	keyID    string
	now      func() time.Time
	loginURL func(id string) string

	mu       sync.Mutex      // guards the fields below
	users    map[string]User // by username
	clients  map[string]Client
	requests map[string]*authRequest
	codes    map[string]string // code -> request id
	tokens   map[string]*accessToken
	// refresh holds the live refresh tokens (offline_access), issued
	// every one ever issued (IssuedRefreshTokens).
	refresh map[string]*refreshGrant
	issued  []string
	// idjagRules is the token-exchange policy (tokenexchange.go).
	idjagRules []IDJAGRule
}

var _ op.Storage = (*storage)(nil)

func (s *storage) userBySubject(sub string) (User, bool) {
	for _, u := range s.users {
		if u.Subject == sub {
			return u, true
		}
	}
	return User{}, false
}

// gc drops expired requests and tokens; callers hold s.mu.
func (s *storage) gc() {
	now := s.now()
	for id, r := range s.requests {
		if now.Sub(r.created) > authRequestTTL {
			delete(s.requests, id)
		}
	}
	for code, id := range s.codes {
		if _, ok := s.requests[id]; !ok {
			delete(s.codes, code)
		}
	}
	for id, t := range s.tokens {
		if now.After(t.expiry) {
			delete(s.tokens, id)
		}
	}
	for rt, g := range s.refresh {
		if now.After(g.expiry) {
			delete(s.refresh, rt)
		}
	}
}

func (s *storage) CreateAuthRequest(_ context.Context, req *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	id, err := randomString(16)
	if err != nil {
		return nil, err
	}
	a := &authRequest{
		id:           id,
		clientID:     req.ClientID,
		redirectURI:  req.RedirectURI,
		scopes:       slices.Clone(req.Scopes),
		state:        req.State,
		nonce:        req.Nonce,
		responseType: req.ResponseType,
		responseMode: req.ResponseMode,
		prompt:       slices.Clone(req.Prompt),
		maxAge:       req.MaxAge,
		created:      s.now(),
	}
	if req.CodeChallenge != "" {
		a.challenge = &oidc.CodeChallenge{Challenge: req.CodeChallenge, Method: req.CodeChallengeMethod}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gc()
	s.requests[id] = a
	return a, nil
}

// request returns a copy-safe pointer to the request (requests are only
// mutated under s.mu by completeRequest).
func (s *storage) request(id string) (*authRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.requests[id]
	if !ok || s.now().Sub(a.created) > authRequestTTL {
		return nil, fmt.Errorf("devidp: auth request: %w", errNotFound)
	}
	cp := *a
	return &cp, nil
}

func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	return s.request(id)
}

// completeRequest marks a pending request as signed in by subject.
func (s *storage) completeRequest(id, subject string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.requests[id]
	if !ok || a.done {
		return fmt.Errorf("devidp: complete auth request: %w", errNotFound)
	}
	a.subject = subject
	a.authTime = s.now()
	a.done = true
	return nil
}

func (s *storage) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	id, ok := s.codes[code]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("devidp: code: %w", errNotFound)
	}
	return s.request(id)
}

func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.requests[id]; !ok {
		return fmt.Errorf("devidp: save code: %w", errNotFound)
	}
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest makes the request and its code unusable (codes are single use).
func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

func (s *storage) CreateAccessToken(_ context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, err := randomString(16)
	if err != nil {
		return "", time.Time{}, err
	}
	t := &accessToken{
		subject: req.GetSubject(),
		scopes:  slices.Clone(req.GetScopes()),
		expiry:  s.now().Add(accessTokenTTL),
	}
	if a, ok := req.(*authRequest); ok {
		t.clientID = a.clientID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[id] = t
	return id, t.expiry, nil
}

func (s *storage) TerminateSession(context.Context, string, string) error { return nil }

func (s *storage) RevokeToken(_ context.Context, tokenOrID, _, clientID string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tokens[tokenOrID]; ok && t.clientID == clientID {
		delete(s.tokens, tokenOrID)
	}
	if g, ok := s.refresh[tokenOrID]; ok && g.clientID == clientID {
		delete(s.refresh, tokenOrID)
	}
	return nil
}

func (s *storage) GetRefreshTokenInfo(_ context.Context, clientID, token string) (string, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.refresh[token]; ok && g.clientID == clientID {
		return g.subject, token, nil
	}
	return "", "", op.ErrInvalidRefreshToken
}

// signingKey is the IdP's RS256 key.
type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k signingKey) Key() any                                    { return k.key }
func (k signingKey) ID() string                                  { return k.id }

// publicKey is the verification half published in the JWKS.
type publicKey struct {
	id  string
	key *rsa.PublicKey
}

func (k publicKey) ID() string                         { return k.id }
func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return k.key }

func (s *storage) SigningKey(context.Context) (op.SigningKey, error) {
	return signingKey{id: s.keyID, key: s.key}, nil
}

func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{id: s.keyID, key: &s.key.PublicKey}}, nil
}

func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok {
		return nil, fmt.Errorf("devidp: client: %w", errNotFound)
	}
	return &client{c: c, loginURL: s.loginURL}, nil
}

func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	s.mu.Lock()
	c, ok := s.clients[id]
	s.mu.Unlock()
	// Compare even for unknown clients so timing says little.
	want := c.Secret
	if !ok {
		want = "\x00unknown-client"
	}
	if subtle.ConstantTimeCompare([]byte(want), []byte(secret)) != 1 || !ok || c.Secret == "" {
		return errors.New("devidp: invalid client credentials")
	}
	return nil
}

func (s *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest fills the ID token's user claims: email and name
// are always included (the contract for this IdP's ID tokens).
func (s *storage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, req op.IDTokenRequest, _ []string) error {
	return s.fillUserinfo(info, req.GetSubject())
}

func (s *storage) fillUserinfo(info *oidc.UserInfo, subject string) error {
	s.mu.Lock()
	u, ok := s.userBySubject(subject)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("devidp: user: %w", errNotFound)
	}
	info.Subject = u.Subject
	info.Email = u.Email
	info.EmailVerified = oidc.Bool(true)
	info.Name = u.Name
	info.PreferredUsername = u.Username
	return nil
}

func (s *storage) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, tokenID, subject, _ string) error {
	s.mu.Lock()
	t, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok || t.subject != subject || s.now().After(t.expiry) {
		return errors.New("devidp: token is invalid or has expired")
	}
	return s.fillUserinfo(info, subject)
}

func (s *storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errors.New("devidp: introspection is not supported")
}

func (s *storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("devidp: JWT profile is not supported")
}

func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("devidp: JWT profile is not supported")
}

func (s *storage) Health(context.Context) error { return nil }
