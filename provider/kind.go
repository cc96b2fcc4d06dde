package provider

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"time"

	"golang.org/x/oauth2"

	"credbroker/vault"
)

// Kind is what an entry's type in providers.yaml makes of it: a type of
// this package holding that kind's configuration. What a kind can do is
// said by the capability interfaces below, found by type assertion, as
// dex's connectors are; callers ask "can you refresh?", never "which type
// are you?".
//
// Every kind has exactly one browser step, RedirectStep or FormStep. The
// other capabilities are optional.
type Kind interface {
	// Type is the entry's type as written in providers.yaml ("oauth2").
	Type() string
}

// RedirectStep is a kind whose person connects at the provider: the
// browser is sent to the provider's authorization endpoint and comes back
// to the broker's callback with a code (the OAuth 2.0 authorization code
// flow). Its connections hold tokens.
type RedirectStep interface {
	Kind
	// ConsentPage names the broker's page shown before the redirect: the
	// template web/templates/<name>.html.
	ConsentPage() string
	// authRequest builds the authorization request for scopes (from
	// Client.Scopes) with the broker's callback redirectURL.
	authRequest(ctx context.Context, k *Client, p *Provider, scopes []string, redirectURL string) (AuthRequest, error)
	// redeem exchanges the code at the token endpoint (never following a
	// redirect) with what a.State's request carried (verifier).
	redeem(ctx context.Context, k *Client, p *Provider, redirectURL, code string, a AuthRequest) (*oauth2.Token, error)
	// responseIssuer says how authorization responses name their issuer
	// (RFC 9207): the issuer, and whether the iss parameter is required.
	responseIssuer(ctx context.Context, k *Client, p *Provider) (string, bool, error)
}

// FormStep is a kind whose person connects on the broker's own page: they
// enter values (an API key, an email and a token) that the broker checks
// and verifies with the provider before anything is stored. What was
// entered is a credential the person holds, never handed out, and has no
// scopes.
type FormStep interface {
	Kind
	// Form describes the page: its fields and instructions.
	Form() Form
	// verify checks what the person entered and asks the provider whose
	// it is (Client.VerifyKey).
	verify(ctx context.Context, k *Client, p *Provider, values map[string]string) (Exchanged, error)
}

// Form is the page of a FormStep.
type Form struct {
	// Page names the template: web/templates/<Page>.html.
	Page string
	// Instructions are plain text shown on the page; InstructionsURL is
	// where the person creates (and revokes) the credential.
	Instructions    string
	InstructionsURL string
	// Fields are the page's inputs, in order.
	Fields []KeyField
}

// Refresher is a kind whose connections hold a refresh token the broker
// uses to keep access tokens fresh (Client.Token, Do, KeepAlive).
type Refresher interface {
	Kind
	// refreshToken spends refreshToken at the token endpoint. ctx carries
	// the HTTP client (oauth2.HTTPClient) the request must go through.
	refreshToken(ctx context.Context, k *Client, p *Provider, refreshToken string) (*oauth2.Token, error)
	// expectsRefreshToken reports whether a grant of scopes should come
	// with a refresh token (offline access asked for).
	expectsRefreshToken(scopes []string) bool
}

// Revoker is a kind whose tokens can be revoked at the provider
// (Client.Revoke). Without it a revocation is NotSupported.
type Revoker interface {
	Kind
	revoke(ctx context.Context, k *Client, p *Provider, c vault.Connection, shared bool) (Revocation, error)
}

// TokenExporter is a kind whose access tokens may be handed to co-located
// servers when the entry allows it (sidecar_token_export).
type TokenExporter interface {
	Kind
	exportsTokens()
}

// AccountLookup is a redirect kind that learns which provider account a
// token response belongs to (a verified ID token, an account endpoint).
type AccountLookup interface {
	Kind
	// lookupAccount names the account tok belongs to, for person pr.
	lookupAccount(ctx context.Context, k *Client, p *Provider, pr vault.Principal, tok *oauth2.Token, nonce string) (Account, error)
}

// apiCaller is a kind whose connections call the provider's API
// (Client.Do): it puts the connection's credential on the request.
type apiCaller interface {
	Kind
	do(ctx context.Context, k *Client, p *Provider, call apiCall) (APIResponse, error)
}

// AuthRequest is the authorization request of a redirect step: where the
// browser goes and what its callback needs. Nothing is stored: the caller
// carries State, Verifier, Nonce and Scopes to the callback (a sealed
// cookie) and hands them back to Exchange.
type AuthRequest struct {
	// URL is the provider's authorization endpoint with every parameter.
	URL string
	// Endpoint is the authorization endpoint: its host is shown on the
	// consent page, its origin is where the consent form may lead.
	Endpoint *url.URL
	// State is the request's state parameter; Verifier the PKCE verifier
	// ("" without PKCE); Nonce the OIDC nonce ("" for plain OAuth 2.0).
	State, Verifier, Nonce string
	// Scopes are the scopes asked for, as sent.
	Scopes []string
}

func noStep(p *Provider, step string) error {
	return fmt.Errorf("%w: %s has no %s step", ErrNoStep, p.Name, step)
}

// Scopes returns what an authorization request for scopes asks p for
// (an OIDC provider's openid added first). For a kind without a redirect
// step it returns scopes.
func (k *Client) Scopes(p *Provider, scopes []string) []string {
	if s, ok := p.Kind.(interface{ requestScopes([]string) []string }); ok {
		return s.requestScopes(scopes)
	}
	return scopes
}

// AuthRequest builds p's authorization request for scopes (as Scopes
// returns them) back to the broker's redirectURL: fresh state, PKCE and
// nonce where the entry uses them. An OIDC provider's endpoints are
// discovered on first use (ErrProviderUnavailable when that fails).
func (k *Client) AuthRequest(ctx context.Context, p *Provider, scopes []string, redirectURL string) (AuthRequest, error) {
	step, ok := p.Kind.(RedirectStep)
	if !ok {
		return AuthRequest{}, noStep(p, "redirect")
	}
	return step.authRequest(ctx, k, p, scopes, redirectURL)
}

// ResponseIssuer says how p's authorization responses name their issuer
// (RFC 9207): the issuer the provider's metadata names, and whether that
// metadata promises the iss parameter (authorization_response_iss_
// parameter_supported), in which case a response without it must be
// refused. An entry without metadata answers ("", false, nil): an iss it
// sends cannot be checked.
func (k *Client) ResponseIssuer(ctx context.Context, p *Provider) (issuer string, required bool, err error) {
	step, ok := p.Kind.(RedirectStep)
	if !ok {
		return "", false, noStep(p, "redirect")
	}
	return step.responseIssuer(ctx, k, p)
}

// Exchange redeems an authorization code of request a (from AuthRequest,
// carried by the caller) at p's token endpoint and establishes the
// connected account (AccountLookup) of person pr. The result's token set is for the
// connections layer's store only.
func (k *Client) Exchange(ctx context.Context, p *Provider, pr vault.Principal, redirectURL, code string, a AuthRequest) (ex Exchanged, err error) {
	ctx, span := k.startSpan(ctx, "provider.code_exchange")
	defer func() { endSpan(span, err, "code exchange failed") }()
	step, ok := p.Kind.(RedirectStep)
	if !ok {
		return Exchanged{}, noStep(p, "redirect")
	}
	tok, err := step.redeem(ctx, k, p, redirectURL, code, a)
	if err != nil {
		k.auditDropped(ctx, err, pr, "")
		return Exchanged{}, err
	}
	lookup, ok := p.Kind.(AccountLookup)
	if !ok {
		return Exchanged{}, fmt.Errorf("%w: %s has no way to name the account", ErrAccountUnknown, p.Name)
	}
	acct, err := lookup.lookupAccount(k.HTTPContext(ctx, p), k, p, pr, tok, a.Nonce)
	if errors.Is(err, ErrWrongDomain) {
		return Exchanged{}, err
	}
	if err != nil {
		return Exchanged{}, fmt.Errorf("%w: %v", ErrAccountUnknown, err)
	}
	out := Exchanged{Account: acct, Scopes: p.NormalizeScopes(a.Scopes), Token: TokenSet(tok),
		RefreshExpiry: refreshExpiry(tok, k.opts.Now())}
	if granted := grantedScopes(tok); granted != nil {
		out.Scopes = p.NormalizeScopes(granted)
	}
	return out, nil
}

// VerifyKey checks what a person entered on p's form (field name → value,
// as posted) and asks the provider whose it is, before anything is
// stored: the fields' checks (a *KeyFormatError sends nothing), then the
// entry's verify request with the credential injected, never following a
// redirect. Only a 2xx answer naming an account gives a result, whose
// token set holds the fields for the connections layer's store. A refusal
// is a *KeyRefusedError (4xx), ErrProviderUnavailable (no answer, 5xx) or
// ErrAccountUnknown (no account id in the answer); none holds a value.
func (k *Client) VerifyKey(ctx context.Context, p *Provider, values map[string]string) (Exchanged, error) {
	step, ok := p.Kind.(FormStep)
	if !ok {
		return Exchanged{}, noStep(p, "form")
	}
	return step.verify(ctx, k, p, values)
}

// ExpectsRefreshToken reports whether a grant of scopes from p should
// come with a refresh token (offline_access requested, or offline access
// asked for in extra_auth_params): without one, access ends when the
// access token expires.
func (p *Provider) ExpectsRefreshToken(scopes []string) bool {
	r, ok := p.Kind.(Refresher)
	return ok && r.expectsRefreshToken(scopes)
}

// Account is the provider account a token set belongs to.
type Account struct {
	// ID is the provider's stable account id (GitHub numeric id, OIDC sub).
	ID string
	// Login is the display login or email.
	Login string
}

// Exchanged is the result of a browser step: who, what was granted, and
// the token set, which only the connections layer's store may receive.
type Exchanged struct {
	Account Account
	// Scopes are the scopes the provider says it granted (its "scope"
	// answer, under the catalogue's names), or the requested ones when it
	// does not say.
	Scopes []string
	Token  vault.TokenSet
	// RefreshExpiry is when the refresh token expires, from the answer's
	// refresh_token_expires_in (zero: not said).
	RefreshExpiry time.Time
}

// randomToken is a fresh random value for a state or a nonce.
func randomToken() string { return rand.Text() }
