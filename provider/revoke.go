package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"credbroker/internal/egress"
	"credbroker/vault"
)

// Revocation is what asking a provider to revoke a connection's tokens
// came to. Every front door reports it the same way.
type Revocation string

const (
	// Revoked: the provider confirmed the revocation.
	Revoked Revocation = "revoked"
	// NotConfirmed: the provider answered an error or did not answer in
	// time; the grant may still be listed in the person's provider settings.
	NotConfirmed Revocation = "not_confirmed"
	// NotSupported: no revocation is configured for the provider.
	NotSupported Revocation = "not_supported"
	// KeptShared: nothing was revoked because another connection of the
	// broker uses the same provider account, and this provider can only
	// revoke everything the app holds for the account at once.
	KeptShared Revocation = "kept_shared"
)

const revokeTimeout = 15 * time.Second

// Revoke asks c's provider to revoke its tokens. c must carry its token
// set (from GetConnection). shared says that another connection (another
// person's, say) holds tokens of the same provider account.
//
//   - RFC 7009: the refresh token when there is one (that ends the grant),
//     else the access token, with the entry's client authentication. When
//     shared and the entry says revocation is account-wide (Google's is),
//     nothing is revoked: KeptShared.
//   - GitHub: the grant is deleted (DELETE …/grant), which ends every
//     token of the app for the account; when shared, only c's token is
//     deleted (DELETE …/token), or KeptShared without token_url. GitHub
//     needs a valid access token for either, so an expiring token is
//     refreshed first.
//
// The error, set only with NotConfirmed, says why for the log; it never
// holds token material.
func (k *Client) Revoke(ctx context.Context, c vault.Connection, shared bool) (Revocation, error) {
	p, ok := k.opts.Providers.Lookup(c.Provider)
	if !ok {
		return NotSupported, nil
	}
	r, ok := p.Kind.(Revoker)
	if !ok {
		return NotSupported, nil
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	return r.revoke(ctx, k, p, c, shared)
}

func (o *OAuth) revoke(ctx context.Context, k *Client, p *Provider, c vault.Connection, shared bool) (Revocation, error) {
	switch o.RevocationStyle {
	case RevokeGitHubGrant:
		return o.revokeGitHub(ctx, k, p, c, shared)
	case RevokeRFC7009:
		return o.revokeRFC7009(ctx, k, p, c, o.RevocationURL, shared)
	case "":
		if o.OIDC && !o.RevocationDisabled {
			return o.revokeRFC7009(ctx, k, p, c, "", shared)
		}
	}
	return NotSupported, nil
}

// live reports whether c's access token can be assumed valid: the
// connection is not known dead and the token has not expired.
func (k *Client) live(c vault.Connection) bool {
	return c.Status != vault.StatusNeedsReconnect && c.Token.AccessToken != "" &&
		(c.Token.Expiry.IsZero() || k.opts.Now().Before(c.Token.Expiry))
}

// revokeRFC7009 posts c's token to endpoint ("": discovery's
// revocation_endpoint).
func (o *OAuth) revokeRFC7009(ctx context.Context, k *Client, p *Provider, c vault.Connection, endpoint string, shared bool) (Revocation, error) {
	if endpoint == "" {
		var err error
		if endpoint, err = o.discoveredRevocation(ctx, k, p); err != nil {
			return NotConfirmed, fmt.Errorf("provider: revoke %s: %w", p.Name, err)
		}
		if endpoint == "" {
			return NotSupported, nil
		}
	}
	if shared && o.RevocationAccountWide {
		return KeptShared, nil
	}
	form := url.Values{}
	sentRefresh := false
	if rt := c.Token.RefreshToken.Reveal(); rt != "" {
		form.Set("token", rt)
		form.Set("token_type_hint", "refresh_token")
		sentRefresh = true
	} else {
		form.Set("token", c.Token.AccessToken.Reveal())
		form.Set("token_type_hint", "access_token")
	}
	if o.TokenAuthInParams {
		form.Set("client_id", o.ClientID)
		form.Set("client_secret", o.ClientSecret.Reveal())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return NotConfirmed, fmt.Errorf("provider: revoke %s: %w", p.Name, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if !o.TokenAuthInParams {
		req.SetBasicAuth(url.QueryEscape(o.ClientID), url.QueryEscape(o.ClientSecret.Reveal()))
	}
	return k.sendRevocation(req, p, func(status int, code string) bool {
		// Google answers 400 invalid_token for a token that is already
		// dead: a refresh token (or a live access token) can only be dead
		// because the grant was revoked, so access is gone.
		return status == http.StatusBadRequest && code == "invalid_token" && (sentRefresh || k.live(c))
	})
}

// revokeGitHub deletes c's GitHub grant, or only its token when shared.
func (o *OAuth) revokeGitHub(ctx context.Context, k *Client, p *Provider, c vault.Connection, shared bool) (Revocation, error) {
	endpoint := o.RevocationURL
	if shared {
		if o.RevocationTokenURL == "" {
			return KeptShared, nil
		}
		endpoint = o.RevocationTokenURL
	}
	if !k.fresh(c) && c.Token.RefreshToken != "" && c.ID != "" {
		// GitHub deletes a grant or token only when given a valid access
		// token, and GitHub App tokens expire after eight hours.
		fresh, err := k.refresh(ctx, c.ID, "")
		if err != nil {
			return NotConfirmed, fmt.Errorf("provider: revoke %s: refreshing the expired access token first: %w", p.Name, err)
		}
		c = fresh
	}
	body, _ := json.Marshal(map[string]string{"access_token": c.Token.AccessToken.Reveal()})
	u := strings.ReplaceAll(endpoint, "{client_id}", url.PathEscape(o.ClientID))
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u, bytes.NewReader(body))
	if err != nil {
		return NotConfirmed, fmt.Errorf("provider: revoke %s: %w", p.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/vnd.github+json")
	// GitHub requires basic authentication as the app here, whatever the
	// token endpoint takes.
	req.SetBasicAuth(o.ClientID, o.ClientSecret.Reveal())
	return k.sendRevocation(req, p, func(status int, _ string) bool {
		// The token was valid by everything the broker knows, and GitHub
		// no longer knows it: it was revoked meanwhile. A 404 for a token
		// that may have expired says nothing about the grant.
		return status == http.StatusNotFound && k.live(c)
	})
}

// sendRevocation sends req without following redirects and reads the
// answer: a 2xx is Revoked, and so is an error answer that gone says
// shows the access already ended (given the status and the answer's
// OAuth error code, "" when it has none); anything else is NotConfirmed.
func (k *Client) sendRevocation(req *http.Request, p *Provider, gone func(status int, code string) bool) (Revocation, error) {
	// Never redirected: a 307/308 would replay the token elsewhere.
	resp, err := NoRedirectClient(k.httpFor(p)).Do(req)
	if err != nil {
		return NotConfirmed, fmt.Errorf("provider: revoke %s: %s", p.Name, describeRefreshErr(err))
	}
	defer resp.Body.Close()
	body, _ := egress.ReadAll(resp.Body, 64<<10)
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return Revoked, nil
	}
	var e struct {
		Error string `json:"error"`
	}
	if resp.StatusCode < 400 || json.Unmarshal(body, &e) != nil || len(e.Error) > 64 || strings.ContainsAny(e.Error, "\x00\r\n") {
		e.Error = ""
	}
	if gone(resp.StatusCode, e.Error) {
		return Revoked, nil
	}
	if e.Error == "" {
		return NotConfirmed, fmt.Errorf("provider: revoke %s: HTTP %d", p.Name, resp.StatusCode)
	}
	return NotConfirmed, fmt.Errorf("provider: revoke %s: HTTP %d %q", p.Name, resp.StatusCode, e.Error)
}

// discoveredRevocation returns the revocation_endpoint of p's OIDC
// discovery document ("" when it has none).
func (o *OAuth) discoveredRevocation(ctx context.Context, k *Client, p *Provider) (string, error) {
	if !o.OIDC {
		return "", nil
	}
	op, err := k.discover(ctx, p.Name, o.Issuer)
	if err != nil {
		return "", err
	}
	var meta struct {
		Revocation string `json:"revocation_endpoint"`
	}
	if err := op.Claims(&meta); err != nil || meta.Revocation == "" {
		return "", nil
	}
	if err := checkEndpoint(meta.Revocation); err != nil {
		return "", errors.New("discovery: revocation_endpoint " + err.Error())
	}
	return meta.Revocation, nil
}
