package provider

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/oauth2"

	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/vault"
)

// Enterprise-managed authorization upstream (the MCP extension
// io.modelcontextprotocol/enterprise-managed-authorization on
// draft-ietf-oauth-identity-assertion-authz-grant), the broker being the
// client: for an mcp entry with auth: enterprise whose authorization
// server takes the JWT bearer grant, the broker
//
//  1. presents a fresh ID token of the person (idpsession.go) at the
//     organisation's IdP, authenticating as its client there, in an RFC
//     8693 token exchange for an ID-JAG whose audience is the server's
//     authorization server (its issuer, as discovered) and whose resource
//     is mcp.url, with the entry's scopes;
//  2. checks that the answer is an ID-JAG for exactly that audience and
//     resource (it is never sent anywhere else);
//  3. redeems it at the authorization server's token endpoint with the
//     JWT bearer grant (RFC 7523) as the broker's client there (static
//     or a metadata document, as for auth: oauth), with resource and
//     scope;
//
// and the answer becomes the person's connection, stored like any other.
// Without a refresh token (the draft: none SHOULD be issued), the access
// token is renewed the same way when it expires or the server refuses it
// (Client.refresh). Every attempt is an audit event and counts in
// credbroker_upstream_idjag_total. A refusal (no IdP session, the IdP's
// policy, the server's authorization server) is an *AssertionRefusedError
// whose reason names no secret: the person is then asked to connect in
// the browser (the code flow), told why.

// The protocol's identifiers.
const (
	grantTokenExchange = "urn:ietf:params:oauth:grant-type:token-exchange"
	grantJWTBearer     = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	tokenTypeIDJAG     = "urn:ietf:params:oauth:token-type:id-jag"
	tokenTypeIDToken   = "urn:ietf:params:oauth:token-type:id_token"
	typIDJAG           = "oauth-id-jag+jwt"
)

// AssertionStep is a kind whose person can be connected with no browser
// step: the organisation's IdP issues an assertion for the provider (an
// ID-JAG) that the provider's authorization server redeems. It is on only
// where the entry says so (mcp.auth: enterprise); the kind keeps its
// browser step for when it is refused.
type AssertionStep interface {
	Kind
	assertionEnabled() bool
	// assertionGrant gets an access token for pr with scopes: the ID-JAG
	// asked for and redeemed.
	assertionGrant(ctx context.Context, k *Client, p *Provider, pr vault.Principal, scopes []string) (*oauth2.Token, error)
}

// AssertionRefusedError: connecting without the browser was refused
// (Outcome, a telemetry.UpstreamIDJAG* code) for Reason, in words for
// the person, naming no secret.
type AssertionRefusedError struct {
	Outcome string
	Reason  string
}

func (e *AssertionRefusedError) Error() string { return "provider: no ID-JAG: " + e.Reason }

func refusal(outcome, reason string) *AssertionRefusedError {
	return &AssertionRefusedError{Outcome: outcome, Reason: reason}
}

// ConnectsByAssertion reports whether p connects by assertions first
// (mcp.auth: enterprise) and the broker keeps the IdP sessions that needs.
func (k *Client) ConnectsByAssertion(p *Provider) bool {
	a, ok := p.Kind.(AssertionStep)
	return ok && a.assertionEnabled() && k.opts.IdPSessions != nil && k.opts.IdP != nil
}

// ConnectByAssertion connects person pr to p with scopes without the
// browser (see above), for the connections layer's store only. via names
// who asked, for the audit event. Errors: *AssertionRefusedError (ask the
// person in the browser), *UpstreamError (the server's metadata is
// unusable), ErrProviderUnavailable wrapped (no answer).
func (k *Client) ConnectByAssertion(ctx context.Context, p *Provider, pr vault.Principal, scopes []string, via string) (Exchanged, error) {
	a, ok := p.Kind.(AssertionStep)
	if !ok || !a.assertionEnabled() {
		return Exchanged{}, noStep(p, "assertion")
	}
	tok, err := k.assertion(ctx, a, p, pr, scopes, via)
	if err != nil {
		return Exchanged{}, err
	}
	acct, err := p.Kind.(AccountLookup).lookupAccount(k.HTTPContext(ctx, p), k, p, pr, tok, "")
	if err != nil {
		return Exchanged{}, fmt.Errorf("%w: %v", ErrAccountUnknown, err)
	}
	out := Exchanged{Account: acct, Scopes: p.NormalizeScopes(scopes), Token: TokenSet(tok), RefreshExpiry: refreshExpiry(tok, k.opts.Now())}
	if granted := grantedScopes(tok); granted != nil {
		out.Scopes = p.NormalizeScopes(granted)
	}
	return out, nil
}

// assertion runs a's grant and records it: the audit event and the
// counter, by outcome.
func (k *Client) assertion(ctx context.Context, a AssertionStep, p *Provider, pr vault.Principal, scopes []string, via string) (*oauth2.Token, error) {
	ctx, span := k.startSpan(ctx, "provider.idjag")
	tok, err := a.assertionGrant(ctx, k, p, pr, scopes)
	endSpan(span, err, "no access token by ID-JAG")
	ev := telemetry.Event{Kind: telemetry.EventUpstreamIDJAGIssued, Principal: pr, Provider: p.Name, Via: via, Outcome: telemetry.UpstreamIDJAGIssued}
	var ar *AssertionRefusedError
	var ue *UpstreamError
	switch {
	case err == nil:
	case errors.As(err, &ar):
		ev.Kind, ev.Outcome, ev.Err = telemetry.EventUpstreamIDJAGRefused, ar.Outcome, errors.New(ar.Reason)
	case errors.As(err, &ue):
		ev.Kind, ev.Outcome, ev.Err = telemetry.EventUpstreamIDJAGRefused, telemetry.UpstreamIDJAGUnavailable, errors.New(ue.Reason)
	default:
		ev.Kind, ev.Outcome, ev.Err = telemetry.EventUpstreamIDJAGRefused, telemetry.UpstreamIDJAGUnavailable, err
	}
	k.opts.Telemetry.UpstreamIDJAG(p.Name, ev.Outcome)
	if k.opts.Telemetry == nil {
		k.log.Info("audit: "+ev.Kind, "provider", p.Name, "outcome", ev.Outcome, "via", via)
	} else {
		k.opts.Telemetry.Audit(ctx, ev)
	}
	return tok, err
}

func (m *MCP) assertionEnabled() bool { return m.Enterprise }

func (m *MCP) assertionGrant(ctx context.Context, k *Client, p *Provider, pr vault.Principal, scopes []string) (*oauth2.Token, error) {
	ua, err := m.discover(ctx, k, p)
	if err != nil {
		return nil, err
	}
	// The draft: an authorization server that advertises the ID-JAG
	// profile (authorization_grant_profiles_supported) MUST also list the
	// JWT bearer grant in grant_types_supported, which is what is read.
	if !slices.Contains(ua.meta.GrantTypesSupported, grantJWTBearer) {
		return nil, refusal(telemetry.UpstreamIDJAGNotSupported, "its authorization server does not take ID-JAGs (no JWT bearer grant in its metadata)")
	}
	cl, err := m.client(ctx, k, p, ua, k.opts.RedirectURL(p.Name))
	if err != nil {
		return nil, err
	}
	subject, err := k.idToken(ctx, pr)
	if err != nil {
		return nil, err
	}
	jag, err := k.requestIDJAG(ctx, ua.issuer, m.up.URL, scopes, subject)
	if err != nil {
		return nil, err
	}
	form := url.Values{"grant_type": {grantJWTBearer}, "assertion": {jag}, "resource": {m.up.URL}}
	if len(scopes) > 0 {
		form.Set("scope", strings.Join(scopes, " "))
	}
	auth := clientAuth{id: cl.ClientID, secret: cl.ClientSecret.Reveal(), method: cl.AuthMethod}
	tok, oe, err := postToken(ctx, NoRedirectClient(k.httpFor(p)), ua.meta.TokenEndpoint, form, auth, k.opts.Now())
	switch {
	case oe != nil:
		return nil, refusal(telemetry.UpstreamIDJAGServerRefused, "its authorization server refused the ID-JAG ("+oe.String()+")")
	case err != nil:
		return nil, fmt.Errorf("%w: %s token endpoint: %v", ErrProviderUnavailable, p.DisplayName, err)
	}
	return tok, nil
}

// requestIDJAG asks the organisation's IdP for an ID-JAG for audience
// and resource (RFC 8693, as the broker's client there), and checks that
// the answer is one for exactly them.
func (k *Client) requestIDJAG(ctx context.Context, audience, resource string, scopes []string, subject string) (string, error) {
	op, err := k.discover(ctx, idpName, k.opts.IdP.Issuer)
	if err != nil {
		return "", fmt.Errorf("%w: the organisation's IdP: %v", ErrProviderUnavailable, err)
	}
	form := url.Values{"grant_type": {grantTokenExchange}, "requested_token_type": {tokenTypeIDJAG},
		"subject_token": {subject}, "subject_token_type": {tokenTypeIDToken}, "audience": {audience}, "resource": {resource}}
	if len(scopes) > 0 {
		form.Set("scope", strings.Join(scopes, " "))
	}
	auth := clientAuth{id: k.opts.IdP.ClientID, secret: k.opts.IdP.ClientSecret.Reveal(), method: "client_secret_basic"}
	tok, oe, err := postToken(ctx, NoRedirectClient(k.opts.HTTPClient), op.Endpoint().TokenURL, form, auth, k.opts.Now())
	switch {
	case oe != nil:
		return "", refusal(telemetry.UpstreamIDJAGIdPRefused, "the organisation's IdP did not issue an ID-JAG for this server ("+oe.String()+")")
	case err != nil:
		return "", fmt.Errorf("%w: the organisation's IdP token exchange: %v", ErrProviderUnavailable, err)
	case tok.Extra("issued_token_type") != tokenTypeIDJAG:
		return "", fmt.Errorf("%w: the organisation's IdP answered the token exchange with another token type", ErrProviderUnavailable)
	}
	if err := checkIDJAG(tok.AccessToken, audience, resource); err != nil {
		return "", refusal(telemetry.UpstreamIDJAGIdPRefused, "the organisation's IdP issued an ID-JAG the broker does not send: "+err.Error())
	}
	return tok.AccessToken, nil
}

// checkIDJAG reads (it cannot verify: the IdP signs for the audience)
// what an ID-JAG names, so that the broker sends the server's
// authorization server only an ID-JAG of the ID-JAG type for exactly it
// and its resource.
func checkIDJAG(jag, audience, resource string) error {
	parts := strings.Split(jag, ".")
	if len(parts) != 3 {
		return errors.New("not a signed JWT")
	}
	var head struct {
		Typ string `json:"typ"`
	}
	var claims struct {
		Aud      json.RawMessage `json:"aud"`
		Resource json.RawMessage `json:"resource"`
	}
	for i, v := range []any{&head, &claims} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil || json.Unmarshal(b, v) != nil {
			return errors.New("not a readable JWT")
		}
	}
	if !strings.EqualFold(head.Typ, typIDJAG) && !strings.EqualFold(head.Typ, "application/"+typIDJAG) {
		return fmt.Errorf("its typ is %s, not %s", untrusted.Quote(head.Typ), typIDJAG)
	}
	if aud := stringOrOne(claims.Aud); aud != audience {
		return fmt.Errorf("it is for the audience %s, not %s", untrusted.Quote(aud), untrusted.Quote(audience))
	}
	if len(claims.Resource) > 0 {
		if res := stringOrOne(claims.Resource); res != resource {
			return fmt.Errorf("it is for the resource %s, not %s", untrusted.Quote(res), untrusted.Quote(resource))
		}
	}
	return nil
}

// stringOrOne reads a JSON string, or an array of exactly one string;
// anything else reads as "".
func stringOrOne(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) == 1 {
		return ss[0]
	}
	return ""
}

// renewable reports whether c, which has no refresh token, gets a new
// access token by assertion (its entry connects by assertion).
func (k *Client) renewable(c vault.Connection) bool {
	p, ok := k.opts.Providers.Lookup(c.Provider)
	return ok && c.Token.RefreshToken == "" && k.ConnectsByAssertion(p)
}

// renew replaces cur's access token with one a new ID-JAG gets (under
// the connection's refresh lock, as a refresh): the draft's answer to an
// expired access token without a refresh token. A refusal marks the
// connection needs_reconnect (the next call asks the person, saying why);
// an answer for another account is refused the same way.
func (k *Client) renew(ctx context.Context, p *Provider, cur vault.Connection, log *slog.Logger) (vault.Connection, error) {
	a := p.Kind.(AssertionStep)
	tok, err := k.assertion(ctx, a, p, cur.Principal, cur.Scopes, "background")
	var ar *AssertionRefusedError
	switch {
	case errors.As(err, &ar):
		return k.markNeedsReconnect(ctx, cur, log, "no new access token by ID-JAG: "+ar.Reason)
	case err != nil:
		k.refreshFailed(ctx, p, cur, err)
		return vault.Connection{}, err
	}
	acct, err := p.Kind.(AccountLookup).lookupAccount(k.HTTPContext(ctx, p), k, p, cur.Principal, tok, "")
	if err != nil || acct.ID != cur.AccountID {
		return k.markNeedsReconnect(ctx, cur, log, "the access token a new ID-JAG got is not for the connected account")
	}
	ts, now, granted := TokenSet(tok), k.opts.Now(), grantedScopes(tok)
	held := cur.Token.AccessToken
	saved, err := k.save(ctx, cur.ID, func(old vault.Connection) (vault.Connection, error) {
		if old.Token.AccessToken != held || old.Token.RefreshToken != "" {
			return old, errRotatedElsewhere
		}
		old.Token, old.LastRefreshed, old.Updated, old.Status = ts, now, now, vault.StatusActive
		if granted != nil {
			old.Scopes = p.NormalizeScopes(granted)
		}
		return old, nil
	})
	if errors.Is(err, errRotatedElsewhere) {
		return k.opts.Store.GetConnection(ctx, cur.ID)
	}
	if err != nil {
		return vault.Connection{}, fmt.Errorf("provider: save renewed tokens: %w", err)
	}
	log.Info("provider: access token renewed by ID-JAG")
	k.opts.Telemetry.Refresh(p.Name, telemetry.RefreshOK)
	return saved, nil
}
