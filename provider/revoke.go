package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

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
)

const revokeTimeout = 15 * time.Second

// Revoke asks c's provider to revoke its tokens: RFC 7009 (the refresh
// token when there is one, since that ends the whole grant) or GitHub's
// grant deletion. c must carry its token set (from GetConnection). The
// error, set only with NotConfirmed, says why for the log; it never holds
// token material.
func (k *Client) Revoke(ctx context.Context, c vault.Connection) (Revocation, error) {
	p, ok := k.opts.Providers.Lookup(c.Provider)
	if !ok || p.RevocationStyle == "" {
		return NotSupported, nil
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	var req *http.Request
	var err error
	switch p.RevocationStyle {
	case RevokeRFC7009:
		form := url.Values{}
		if rt := c.Token.RefreshToken.Reveal(); rt != "" {
			form.Set("token", rt)
			form.Set("token_type_hint", "refresh_token")
		} else {
			form.Set("token", c.Token.AccessToken.Reveal())
			form.Set("token_type_hint", "access_token")
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, p.RevocationURL, strings.NewReader(form.Encode()))
		if err != nil {
			return NotConfirmed, fmt.Errorf("provider: revoke %s: %w", p.Name, err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	case RevokeGitHubGrant:
		body, _ := json.Marshal(map[string]string{"access_token": c.Token.AccessToken.Reveal()})
		u := strings.ReplaceAll(p.RevocationURL, "{client_id}", url.PathEscape(p.ClientID))
		req, err = http.NewRequestWithContext(ctx, http.MethodDelete, u, bytes.NewReader(body))
		if err != nil {
			return NotConfirmed, fmt.Errorf("provider: revoke %s: %w", p.Name, err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/vnd.github+json")
	default:
		return NotSupported, nil
	}
	req.SetBasicAuth(url.QueryEscape(p.ClientID), url.QueryEscape(p.ClientSecret.Reveal()))
	// Never redirected: a 307/308 would replay the token elsewhere.
	resp, err := NoRedirectClient(k.opts.HTTPClient).Do(req)
	if err != nil {
		return NotConfirmed, fmt.Errorf("provider: revoke %s: %s", p.Name, describeRefreshErr(err))
	}
	defer resp.Body.Close()
	_, _ = readLimited(resp.Body, 64<<10)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return Revoked, nil
	case resp.StatusCode == http.StatusNotFound && p.RevocationStyle == RevokeGitHubGrant:
		// GitHub answers 404 when the token or grant no longer exists.
		return Revoked, nil
	}
	return NotConfirmed, fmt.Errorf("provider: revoke %s: HTTP %d", p.Name, resp.StatusCode)
}
