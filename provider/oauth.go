package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/vault"
)

// The oauth2 and oidc kinds: a provider with the OAuth 2.0 authorization
// code flow (PKCE S256 by default), refresh tokens, revocation, and the
// connected account from a verified ID token (oidc) or an account
// endpoint. exchange.go finds the account, revoke.go revokes, tokens.go
// runs the refresh protocol every Refresher shares.

// Types of the OAuth kinds in providers.yaml.
const (
	// TypeOAuth2 is a plain OAuth 2.0 provider: endpoints are configured and
	// the account is found through the account endpoint.
	TypeOAuth2 = "oauth2"
	// TypeOIDC is an OpenID Connect provider: endpoints come from discovery
	// of the issuer and the account is the verified ID token's subject.
	TypeOIDC = "oidc"
)

// Revocation styles accepted in providers.yaml.
const (
	// RevokeRFC7009 posts the token to an RFC 7009 revocation endpoint.
	RevokeRFC7009 = "rfc7009"
	// RevokeGitHubGrant deletes the whole OAuth app grant the GitHub way:
	// DELETE {url} with the client's basic credentials and the access token
	// in a JSON body. "{client_id}" in the URL is replaced. When another
	// connection uses the same GitHub account, only the one token is
	// deleted (DELETE {token_url}), since deleting the grant would end the
	// other connection's tokens too.
	RevokeGitHubGrant = "github_grant"
	// RevokeNone turns revocation off, also the one an OIDC provider's
	// discovery advertises.
	RevokeNone = "none"
)

// OAuth is the kind of oauth2 and oidc entries.
type OAuth struct {
	// OIDC: endpoints come from discovery of Issuer, the account from the
	// verified ID token.
	OIDC   bool
	Issuer string
	// AuthURL and TokenURL are the endpoints (oauth2; for oidc they
	// override discovery when set).
	AuthURL, TokenURL string
	ClientID          string
	ClientSecret      vault.Secret
	// TokenAuthInParams sends the client credentials in the token request
	// body (client_secret_post) instead of HTTP basic (client_secret_basic,
	// the default).
	TokenAuthInParams bool
	// PKCE reports whether S256 PKCE is sent (default true).
	PKCE bool
	// ExtraAuthParams are added to the authorization request.
	ExtraAuthParams map[string]string
	// HostedDomain (oidc only): the account's domain, sent as hd= and
	// required in the ID token's hd claim ("*": any Workspace domain).
	HostedDomain string
	// AccountURL answers the connected account's identity as JSON;
	// AccountIDField and AccountLoginField name the fields.
	AccountURL, AccountIDField, AccountLoginField string
	// RevocationStyle is "", RevokeRFC7009 or RevokeGitHubGrant.
	// RevocationURL may be empty for an OIDC provider: discovery's
	// revocation_endpoint is used. RevocationTokenURL (GitHub) deletes one
	// token instead of the whole grant.
	RevocationStyle    string
	RevocationURL      string
	RevocationTokenURL string
	// RevocationAccountWide: revoking any token ends every token of the
	// app for the account (GitHub grants always do).
	RevocationAccountWide bool
	// RevocationDisabled: style none (an OIDC provider's discovered
	// revocation_endpoint is not used either).
	RevocationDisabled bool
}

var (
	_ RedirectStep  = (*OAuth)(nil)
	_ AccountLookup = (*OAuth)(nil)
	_ Refresher     = (*OAuth)(nil)
	_ Revoker       = (*OAuth)(nil)
	_ TokenExporter = (*OAuth)(nil)
	_ apiCaller     = (*OAuth)(nil)
)

// Type is TypeOIDC or TypeOAuth2.
func (o *OAuth) Type() string {
	if o.OIDC {
		return TypeOIDC
	}
	return TypeOAuth2
}

// ConsentPage is the broker's consent page.
func (o *OAuth) ConsentPage() string { return "consent" }

func (o *OAuth) exportsTokens() {}

// oauthSpec is an oauth2 or oidc entry as written in providers.yaml.
type oauthSpec struct {
	entrySpec        `yaml:",inline"`
	scopeSpec        `yaml:",inline"`
	Issuer           string            `yaml:"issuer"`
	AuthorizationURL string            `yaml:"authorization_url"`
	TokenURL         string            `yaml:"token_url"`
	ClientID         string            `yaml:"client_id"`
	ClientSecret     string            `yaml:"client_secret"`
	ClientSecretFile string            `yaml:"client_secret_file"`
	TokenAuth        string            `yaml:"token_endpoint_auth"`
	PKCE             *bool             `yaml:"pkce"`
	ExtraAuthParams  map[string]string `yaml:"extra_auth_params"`
	// HostedDomain (OIDC): the Google Workspace domain accounts must
	// belong to; sent as hd= and checked against the ID token's hd claim.
	HostedDomain string          `yaml:"hosted_domain"`
	Account      *accountSpec    `yaml:"account"`
	API          *apiSpec        `yaml:"api"`
	Revocation   *revocationSpec `yaml:"revocation"`
	// SidecarTokenExport lets the sidecar API hand this provider's access
	// tokens to co-located servers (POST /v1/token). Off by default.
	SidecarTokenExport bool `yaml:"sidecar_token_export"`
	// PropagateTrace sends the W3C trace context (traceparent,
	// tracestate) on API requests to this provider. Off by default:
	// trace ids are the broker's to share.
	PropagateTrace bool `yaml:"propagate_trace"`
	// KeepAlive and KeepAliveRefresh: background refresh (keepalive.go).
	KeepAlive        string `yaml:"keep_alive"`
	KeepAliveRefresh string `yaml:"keep_alive_refresh"`
}

type accountSpec struct {
	URL        string `yaml:"url"`
	IDField    string `yaml:"id_field"`
	LoginField string `yaml:"login_field"`
}

type revocationSpec struct {
	Style    string `yaml:"style"`
	URL      string `yaml:"url"`
	TokenURL string `yaml:"token_url"`
	// AccountWide: revoking one token ends every token the provider
	// issued to this client for the account (Google's grant is per account
	// and client).
	AccountWide bool `yaml:"account_wide"`
}

var (
	oauth2Kind = defineKind(TypeOAuth2, onlyFor, buildOAuth)
	oidcKind   = defineKind(TypeOIDC, onlyFor, buildOAuth)
)

// buildOAuth validates an oauth2 or oidc entry (and an entry of no known
// type, so its other problems are reported too).
func buildOAuth(c *entryCheck, s *oauthSpec) *Provider {
	o := &OAuth{OIDC: s.Type == TypeOIDC, PKCE: true, ExtraAuthParams: s.ExtraAuthParams, HostedDomain: s.HostedDomain}
	p := c.newProvider(s.entrySpec, o)
	p.SidecarTokenExport, p.PropagateTrace = s.SidecarTokenExport, s.PropagateTrace
	if s.PKCE != nil {
		o.PKCE = *s.PKCE
	}
	o.endpoints(c, s)
	o.client(c, s)
	c.scopes(p, s.scopeSpec)
	o.extraParams(c, s)
	o.hostedDomain(c, s)
	o.account(c, s)
	c.api(p, s.API)
	o.revocation(c, s)
	c.keepAlive(p, s.KeepAlive, s.KeepAliveRefresh)
	return p
}

// endpoints checks the authorization and token endpoints of the type.
func (o *OAuth) endpoints(c *entryCheck, s *oauthSpec) {
	switch s.Type {
	case TypeOAuth2:
		o.AuthURL = c.url("authorization_url", s.AuthorizationURL, true)
		o.TokenURL = c.url("token_url", s.TokenURL, true)
		if s.Issuer != "" {
			c.fail("issuer", "issuer is only for type %q", TypeOIDC)
		}
		if s.Account == nil {
			c.fail("account", "account (url, id_field, login_field) is required for type %q: it tells which account was connected", TypeOAuth2)
		}
	case TypeOIDC:
		o.Issuer = c.url("issuer", s.Issuer, true)
		o.AuthURL = c.url("authorization_url", s.AuthorizationURL, false)
		o.TokenURL = c.url("token_url", s.TokenURL, false)
	}
	switch s.TokenAuth {
	case "", "client_secret_basic":
	case "client_secret_post":
		o.TokenAuthInParams = true
	default:
		c.fail("token_endpoint_auth", "token_endpoint_auth %q: want client_secret_basic or client_secret_post", s.TokenAuth)
	}
}

// client resolves the client id and the secret, given by reference only.
func (o *OAuth) client(c *entryCheck, s *oauthSpec) {
	if s.ClientID == "" {
		c.fail("client_id", "client_id is required")
	} else {
		o.ClientID, _ = c.secretRef("client_id", s.ClientID, true)
	}
	secret, given := c.clientSecret(s.ClientSecret, s.ClientSecretFile)
	if !given {
		c.fail("client_id", "client_secret or client_secret_file is required")
	}
	o.ClientSecret = secret
}

// extraParams checks extra_auth_params.
func (o *OAuth) extraParams(c *entryCheck, s *oauthSpec) {
	for _, k := range sortedKeys(s.ExtraAuthParams) {
		switch k {
		case "state", "code_challenge", "code_challenge_method", "nonce", "redirect_uri", "client_id", "response_type", "scope":
			c.fail("extra_auth_params", "extra_auth_params: %q is set by the broker and cannot be configured", k)
		case "hd":
			c.fail("extra_auth_params", "extra_auth_params: set hosted_domain instead of hd (the broker then also checks the ID token's hd claim)")
		}
	}
}

// account checks the account endpoint (required for plain OAuth 2.0).
func (o *OAuth) account(c *entryCheck, s *oauthSpec) {
	a := s.Account
	if a == nil {
		return
	}
	o.AccountURL = c.url("account", a.URL, s.Type == TypeOAuth2)
	o.AccountIDField, o.AccountLoginField = a.IDField, a.LoginField
	if a.IDField == "" {
		c.fail("account", "account.id_field is required")
	}
	if a.LoginField == "" {
		o.AccountLoginField = a.IDField
	}
}

// revocation checks the revocation style and endpoint.
func (o *OAuth) revocation(c *entryCheck, s *oauthSpec) {
	rv := s.Revocation
	if rv == nil {
		return
	}
	switch rv.Style {
	case RevokeRFC7009, RevokeGitHubGrant:
		o.RevocationStyle = rv.Style
		o.RevocationAccountWide = rv.AccountWide || rv.Style == RevokeGitHubGrant
	case RevokeNone:
		o.RevocationDisabled = true
		if rv.URL != "" || rv.TokenURL != "" || rv.AccountWide {
			c.fail("revocation", "revocation.style none takes no other field")
		}
		return
	default:
		c.fail("revocation", "revocation.style %q: want %q, %q or %q", rv.Style, RevokeRFC7009, RevokeGitHubGrant, RevokeNone)
	}
	// An OIDC provider's RFC 7009 endpoint may come from discovery
	// (revocation_endpoint).
	if rv.URL == "" && !(s.Type == TypeOIDC && rv.Style == RevokeRFC7009) {
		c.fail("revocation", "revocation.url is required (only an oidc provider's rfc7009 endpoint can come from discovery)")
	} else if c.url("revocation", strings.ReplaceAll(rv.URL, "{client_id}", "client_id"), false) != "" {
		o.RevocationURL = rv.URL
	}
	if rv.TokenURL != "" && rv.Style != RevokeGitHubGrant {
		c.fail("revocation", "revocation.token_url is only for style %q", RevokeGitHubGrant)
	} else if c.url("revocation", strings.ReplaceAll(rv.TokenURL, "{client_id}", "client_id"), false) != "" {
		o.RevocationTokenURL = rv.TokenURL
	}
}

var hostedDomainRE = regexp.MustCompile(`^(\*|[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+)$`)

// hostedDomain checks hosted_domain (OIDC only: it is verified in the ID
// token).
func (o *OAuth) hostedDomain(c *entryCheck, s *oauthSpec) {
	if s.HostedDomain == "" {
		return
	}
	if s.Type != TypeOIDC {
		c.fail("hosted_domain", "hosted_domain is only for type %q (it is checked in the ID token's hd claim)", TypeOIDC)
	}
	if len(s.HostedDomain) > 253 || !hostedDomainRE.MatchString(s.HostedDomain) {
		c.fail("hosted_domain", "hosted_domain %q: want a lowercase domain name such as example.com, or * for any Workspace domain", s.HostedDomain)
	}
}

// config returns the x/oauth2 configuration with the given redirect URL
// ("" for refreshes), discovering an OIDC provider's endpoints on first
// use. Discovery results are cached per Client after success, so the
// browser flow and refreshes share one cache. The returned *oidc.Provider
// is nil for plain OAuth 2.0 providers.
//
// The client authentication style is fixed (client_secret_basic unless the
// entry says client_secret_post): x/oauth2's auto-detection would retry a
// failed request with the other style, spending a code or a rotating
// refresh token twice.
func (o *OAuth) config(ctx context.Context, k *Client, p *Provider, redirectURL string) (*oauth2.Config, *oidc.Provider, error) {
	style := oauth2.AuthStyleInHeader
	if o.TokenAuthInParams {
		style = oauth2.AuthStyleInParams
	}
	conf := &oauth2.Config{
		ClientID: o.ClientID, ClientSecret: o.ClientSecret.Reveal(), RedirectURL: redirectURL,
		Endpoint: oauth2.Endpoint{AuthURL: o.AuthURL, TokenURL: o.TokenURL, AuthStyle: style},
	}
	if !o.OIDC || redirectURL == "" && o.TokenURL != "" {
		// A refresh needs only the token endpoint: no discovery when it is
		// configured.
		return conf, nil, nil
	}
	op, err := k.discover(ctx, p.Name, o.Issuer)
	if err != nil {
		return nil, nil, err
	}
	ep := op.Endpoint()
	if conf.Endpoint.AuthURL == "" {
		conf.Endpoint.AuthURL = ep.AuthURL
	}
	if conf.Endpoint.TokenURL == "" {
		conf.Endpoint.TokenURL = ep.TokenURL
	}
	return conf, op, nil
}

// requestScopes adds openid for an OIDC provider.
func (o *OAuth) requestScopes(scopes []string) []string {
	scopes = slices.Clone(scopes)
	if o.OIDC && !slices.Contains(scopes, oidc.ScopeOpenID) {
		scopes = append([]string{oidc.ScopeOpenID}, scopes...)
	}
	return scopes
}

func (o *OAuth) authRequest(ctx context.Context, k *Client, p *Provider, scopes []string, redirectURL string) (AuthRequest, error) {
	conf, op, err := o.config(ctx, k, p, redirectURL)
	if err != nil {
		return AuthRequest{}, fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
	}
	endpoint, err := url.Parse(conf.Endpoint.AuthURL)
	if err != nil {
		return AuthRequest{}, fmt.Errorf("%w: %s authorization endpoint: %v", ErrProviderUnavailable, p.Name, err)
	}
	a := AuthRequest{Endpoint: endpoint, State: randomToken(), Scopes: slices.Clone(scopes)}
	conf.Scopes = a.Scopes
	var opts []oauth2.AuthCodeOption
	if o.PKCE {
		a.Verifier = oauth2.GenerateVerifier()
		opts = append(opts, oauth2.S256ChallengeOption(a.Verifier))
	}
	if op != nil {
		a.Nonce = randomToken()
		opts = append(opts, oauth2.SetAuthURLParam("nonce", a.Nonce))
	}
	for _, k := range sortedKeys(o.ExtraAuthParams) {
		opts = append(opts, oauth2.SetAuthURLParam(k, o.ExtraAuthParams[k]))
	}
	if o.HostedDomain != "" {
		// Steers Google's account chooser; the callback checks the ID
		// token's hd claim, which is what proves the domain.
		opts = append(opts, oauth2.SetAuthURLParam("hd", o.HostedDomain))
	}
	a.URL = conf.AuthCodeURL(a.State, opts...)
	return a, nil
}

func (o *OAuth) redeem(ctx context.Context, k *Client, p *Provider, redirectURL, code string, a AuthRequest) (*oauth2.Token, error) {
	conf, _, err := o.config(ctx, k, p, redirectURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
	}
	conf.Scopes = a.Scopes
	var opts []oauth2.AuthCodeOption
	if a.Verifier != "" {
		opts = append(opts, oauth2.VerifierOption(a.Verifier))
	}
	tok, err := conf.Exchange(k.TokenContext(ctx, p), code, opts...)
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && (re.ErrorCode == "invalid_grant" || re.ErrorCode == "bad_verification_code") {
			return nil, fmt.Errorf("%w: %s", ErrCodeRejected, DescribeTokenError(err))
		}
		return nil, fmt.Errorf("%w: %s", ErrProviderUnavailable, DescribeTokenError(err))
	}
	return tok, nil
}

func (o *OAuth) responseIssuer(ctx context.Context, k *Client, p *Provider) (string, bool, error) {
	if !o.OIDC {
		return "", false, nil
	}
	op, err := k.discover(ctx, p.Name, o.Issuer)
	if err != nil {
		return "", false, err
	}
	var md struct {
		Issuer    string `json:"issuer"`
		Supported bool   `json:"authorization_response_iss_parameter_supported"`
	}
	if err := op.Claims(&md); err != nil {
		return "", false, fmt.Errorf("provider: %s metadata: %w", p.Name, err)
	}
	return md.Issuer, md.Supported, nil
}

func (o *OAuth) refreshToken(ctx context.Context, k *Client, p *Provider, refreshToken string) (*oauth2.Token, error) {
	conf, _, err := o.config(ctx, k, p, "")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
	}
	// An empty access token makes the source refresh immediately.
	return conf.TokenSource(ctx, &oauth2.Token{RefreshToken: refreshToken}).Token()
}

func (o *OAuth) expectsRefreshToken(scopes []string) bool {
	return slices.Contains(scopes, oidc.ScopeOfflineAccess) || strings.EqualFold(o.ExtraAuthParams["access_type"], "offline")
}

// discover returns the OIDC provider metadata of issuer, cached under
// name after success.
func (k *Client) discover(ctx context.Context, name, issuer string) (*oidc.Provider, error) {
	k.mu.Lock()
	op := k.discovered[name]
	k.mu.Unlock()
	if op != nil {
		return op, nil
	}
	op, err := oidc.NewProvider(oidc.ClientContext(ctx, k.opts.HTTPClient), issuer)
	if err != nil {
		return nil, fmt.Errorf("provider: discover %s: %w", name, err)
	}
	k.mu.Lock()
	k.discovered[name] = op
	k.mu.Unlock()
	return op, nil
}

// HTTPContext carries the HTTP client for p's x/oauth2 and go-oidc
// calls (ID token key sets, account lookups).
func (k *Client) HTTPContext(ctx context.Context, p *Provider) context.Context {
	c := k.httpFor(p)
	ctx = context.WithValue(ctx, oauth2.HTTPClient, c)
	return oidc.ClientContext(ctx, c)
}

// TokenContext carries, for x/oauth2, a copy of p's HTTP client that
// never follows redirects: a token request carries the code, the PKCE
// verifier and the client secret, which a 307/308 would replay to wherever
// it points.
func (k *Client) TokenContext(ctx context.Context, p *Provider) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, NoRedirectClient(k.httpFor(p)))
}

// httpFor is the client for p's token, account and revocation requests:
// the upstream (egress) client for an MCP server the broker relays to,
// which sends an mcp entry's requests only to the hosts it allows.
func (k *Client) httpFor(p *Provider) *http.Client {
	switch kind := p.Kind.(type) {
	case *MCP:
		return kind.gated(k.opts.UpstreamHTTPClient)
	case Gateway:
		return k.opts.UpstreamHTTPClient
	}
	return k.opts.HTTPClient
}

// HTTPClient returns the client the Client talks to providers with.
func (k *Client) HTTPClient() *http.Client { return k.opts.HTTPClient }

// Providers returns the catalogue.
func (k *Client) Providers() *Registry { return k.opts.Providers }

// TokenSet converts a token endpoint answer into the stored form.
func TokenSet(tok *oauth2.Token) vault.TokenSet {
	ts := vault.TokenSet{
		AccessToken: vault.Secret(tok.AccessToken), RefreshToken: vault.Secret(tok.RefreshToken),
		TokenType: tok.Type(), Expiry: tok.Expiry,
	}
	if raw, ok := tok.Extra("id_token").(string); ok && raw != "" {
		ts.IDToken = vault.Secret(raw)
	}
	return ts
}

// DescribeTokenError renders a token endpoint failure for the log without
// the response body (which is the provider's and may echo request
// material).
func DescribeTokenError(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		status := 0
		if re.Response != nil {
			status = re.Response.StatusCode
		}
		return fmt.Sprintf("token endpoint: HTTP %d, error %q", status, re.ErrorCode)
	}
	return err.Error()
}

// describeRefreshErr renders a failed token or API request without the
// provider's response body.
func describeRefreshErr(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		return DescribeTokenError(err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "transport error"
}

// NoRedirectClient returns a copy of c that never follows redirects: a
// token or revocation endpoint has no business redirecting a request that
// carries secrets.
func NoRedirectClient(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}
