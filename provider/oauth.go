package provider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/vault"
)

// OAuthConfig returns the x/oauth2 configuration for p with the given
// redirect URL ("" for refreshes), discovering an OIDC provider's endpoints
// on first use. Discovery results are cached per Client after success, so
// the browser flow and refreshes share one cache. The returned
// *oidc.Provider is nil for plain OAuth 2.0 providers.
//
// The client authentication style is fixed (client_secret_basic unless the
// entry says client_secret_post): x/oauth2's auto-detection would retry a
// failed request with the other style, spending a code or a rotating
// refresh token twice.
func (k *Client) OAuthConfig(ctx context.Context, p *Provider, redirectURL string) (*oauth2.Config, *oidc.Provider, error) {
	style := oauth2.AuthStyleInHeader
	if p.TokenAuthInParams {
		style = oauth2.AuthStyleInParams
	}
	conf := &oauth2.Config{
		ClientID: p.ClientID, ClientSecret: p.ClientSecret.Reveal(), RedirectURL: redirectURL,
		Endpoint: oauth2.Endpoint{AuthURL: p.AuthURL, TokenURL: p.TokenURL, AuthStyle: style},
	}
	if p.Type != TypeOIDC {
		return conf, nil, nil
	}
	op, err := k.discover(ctx, p)
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

// ResponseIssuer says how p's authorization responses name their issuer
// (RFC 9207): for an OIDC provider the discovered issuer, and whether its
// metadata promises the iss parameter (authorization_response_iss_
// parameter_supported), in which case a response without it must be
// refused. A plain OAuth 2.0 entry has no metadata: ("", false, nil), and
// an iss it sends cannot be checked.
func (k *Client) ResponseIssuer(ctx context.Context, p *Provider) (issuer string, required bool, err error) {
	if p.Type != TypeOIDC {
		return "", false, nil
	}
	op, err := k.discover(ctx, p)
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

// discover returns p's OIDC provider metadata, cached after success.
func (k *Client) discover(ctx context.Context, p *Provider) (*oidc.Provider, error) {
	k.mu.Lock()
	op := k.discovered[p.Name]
	k.mu.Unlock()
	if op != nil {
		return op, nil
	}
	op, err := oidc.NewProvider(oidc.ClientContext(ctx, k.opts.HTTPClient), p.Issuer)
	if err != nil {
		return nil, fmt.Errorf("provider: discover %s: %w", p.Name, err)
	}
	k.mu.Lock()
	k.discovered[p.Name] = op
	k.mu.Unlock()
	return op, nil
}

// HTTPContext carries the Client's HTTP client for x/oauth2 and go-oidc
// calls (ID token key sets, account lookups).
func (k *Client) HTTPContext(ctx context.Context) context.Context {
	ctx = context.WithValue(ctx, oauth2.HTTPClient, k.opts.HTTPClient)
	return oidc.ClientContext(ctx, k.opts.HTTPClient)
}

// TokenContext carries, for x/oauth2, a copy of the Client's HTTP client
// that never follows redirects: a token request carries the code, the PKCE
// verifier and the client secret, which a 307/308 would replay to wherever
// it points.
func (k *Client) TokenContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, NoRedirectClient(k.opts.HTTPClient))
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
